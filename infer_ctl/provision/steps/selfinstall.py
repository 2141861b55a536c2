"""inferctl itself on the node, so node-side gatherers (the GPU check's `python -` script) have an
interpreter with their package and NVML bindings: `gpu.python: <sglang.venv>/inferctl/bin/python`.

Layout, like the SGLang venvs: `<venvs>/inferctl-<version>-<bundle12>` is built once and never changed
(`python -m venv --without-pip`, then the wheels the controller built from its own code are uploaded,
sha256-checked on the node and unpacked by a stdlib script that checks each member against RECORD),
and the symlink `<venvs>/inferctl` is switched to it with one rename. Needs no network and no pip on
the node, so air-gapped sites need nothing extra.
"""

from __future__ import annotations

from importlib import resources

import infer_ctl
from infer_ctl.core.provision.model import EntryKind
from infer_ctl.provision.context import Planned, StepContext
from infer_ctl.provision.errors import ProvisionError, StepFailed
from infer_ctl.provision.remote_files import run_checked
from infer_ctl.provision.selfwheel import BuiltWheel, bundle_id, node_wheels
from infer_ctl.remote.base import Command, Connector

LINK = "inferctl"
MARKER = ".inferctl-bundle.sha256"

_PROBE = r"""
L=$1; D=$2; M=$3
printf 'link=%s\n' "$(readlink -- "$L" 2>/dev/null)"
if [ -d "$D" ]; then echo exists=yes; else echo exists=no; fi
printf 'marker=%s\n' "$(cat -- "$D/$M" 2>/dev/null)"
if [ -x "$L/bin/python" ]; then
  printf 'version=%s\n' "$("$L/bin/python" -c 'import importlib.metadata as m; print(m.version("inferctl"))' 2>/dev/null)"
fi
"""

# build the link under a temp name, then rename(2) it over the old one: readers see old or new
_SWITCH = 'ln -sfn -- "$2" "$1.new" && mv -Tf -- "$1.new" "$1"'

_VERSION = "import importlib.metadata as m; print(m.version('inferctl'))"


def installer_script() -> bytes:
    return resources.files("infer_ctl.provision").joinpath("node_install_wheels.py").read_bytes()


def wheels_for(ctx: StepContext) -> list[BuiltWheel]:
    """Built once per run (the runner's shared inputs); built here when a step runs on its own."""
    found = ctx.shared.get("node_wheels")
    if isinstance(found, list):
        return found
    return node_wheels()


def target_dir(venvs: str, version: str, bundle: str) -> str:
    return f"{venvs.rstrip('/')}/inferctl-{version}-{bundle[:12]}"


def probe(conn: Connector, link: str, target: str) -> dict[str, str]:
    result = conn.run(Command("sh", "-c", _PROBE, "sh", link, target, MARKER), timeout=60)
    if not result.ok:
        raise ProvisionError(f"cannot inspect {link} on {conn.node_name}: {result.err.strip()}")
    return dict(line.split("=", 1) for line in result.out.splitlines() if "=" in line)


def remote_sha256(conn: Connector, path: str) -> str | None:
    result = conn.run(Command("sha256sum", "--", path), sudo=True, timeout=120)
    return result.out.split()[0] if result.ok and result.out.split() else None


class InferctlStep:
    name = "inferctl"
    title = "inferctl on the node (<venvs>/inferctl venv from this controller's code) for node-side gatherers"
    needs_sudo = True

    def plan(self, ctx: StepContext) -> list[Planned]:
        sg = ctx.profile.sglang
        wheels = wheels_for(ctx)
        version = infer_ctl.__version__
        bundle = bundle_id(wheels)
        venvs = sg.venv.rstrip("/")
        link, target = f"{venvs}/{LINK}", target_dir(venvs, version, bundle)
        state = probe(ctx.conn, link, target)
        built = state.get("marker") == bundle
        planned: list[Planned] = []
        if built:
            planned.append(Planned(ctx.entry(self.name, target, EntryKind.OK, f"inferctl {version} installed")))
        else:
            reason = "incomplete (an interrupted install?)" if state.get("exists") == "yes" else "not installed"
            planned.append(self._install(ctx, target, version, bundle, wheels, reason, exists=state.get("exists") == "yes"))
        have = state.get("link") or None
        if have == target:
            planned.append(Planned(ctx.entry(self.name, link, EntryKind.OK, f"-> {target} (inferctl {state.get('version') or '?'})")))
        else:
            command = Command("sh", "-c", _SWITCH, "sh", link, target)

            def switch() -> None:
                run_checked(ctx.conn, command, sudo=True, what=f"switch {link} to {target}")

            before = f"{have} (inferctl {state.get('version') or 'not importable'})" if have else "<none>"
            planned.append(
                Planned(
                    ctx.entry(
                        self.name,
                        link,
                        EntryKind.CHANGE,
                        "switch atomically to this controller's inferctl",
                        before=before,
                        after=f"{target} (inferctl {version})",
                        commands=(command.shell(),),
                        needs_sudo=True,
                    ),
                    switch,
                )
            )
        return planned

    def _install(
        self,
        ctx: StepContext,
        target: str,
        version: str,
        bundle: str,
        wheels: list[BuiltWheel],
        reason: str,
        *,
        exists: bool,
    ) -> Planned:
        python = ctx.profile.sglang.python
        make = [Command("rm", "-rf", "--", target)] if exists else []
        make.append(Command(python, "-m", "venv", "--without-pip", target))
        paths = [f"{target}/wheels/{w.filename}" for w in wheels]
        unpack = Command(f"{target}/bin/python", "-", *paths)

        def action() -> None:
            if not target.startswith(ctx.profile.sglang.venv.rstrip("/") + "/inferctl-"):
                raise StepFailed(self.name, f"refusing to touch {target}: outside {ctx.profile.sglang.venv}")
            for command in make:
                run_checked(ctx.conn, command, sudo=True, what=command.shell())
            run_checked(ctx.conn, Command("mkdir", "-p", "--", f"{target}/wheels"), sudo=True, what="mkdir wheels")
            for wheel, path in zip(wheels, paths, strict=True):
                ctx.conn.put_file(path, wheel.data, mode=0o644, sudo=True)
                got = remote_sha256(ctx.conn, path)
                if got != wheel.sha256:
                    raise StepFailed(
                        self.name,
                        f"{path}: sha256 on the node is {got or 'unreadable'}, expected {wheel.sha256}",
                        remedy="check the node's disk and rerun; nothing was installed from it",
                    )
            result = ctx.conn.run(unpack, sudo=True, stdin=installer_script(), timeout=300)
            if not result.ok:
                raise StepFailed(self.name, (result.err or result.out).strip()[-300:] or f"exit {result.exit_code}",
                                 remedy=f"check that {python} on the node can run the venv, then rerun")
            got_version = ctx.conn.run(Command(f"{target}/bin/python", "-c", _VERSION), timeout=60).out.strip()
            if got_version != version:
                raise StepFailed(self.name, f"built {target} but it reports inferctl {got_version or 'not importable'}")
            # the marker goes last: its presence means "complete"
            ctx.conn.put_file(f"{target}/{MARKER}", bundle.encode(), mode=0o644, sudo=True)

        names = ", ".join(w.filename for w in wheels)
        return Planned(
            ctx.entry(
                self.name,
                target,
                EntryKind.CHANGE,
                f"install inferctl {version}: {reason}",
                before=reason,
                after=f"inferctl {version} ({names})",
                commands=(
                    *(c.shell() for c in make),
                    f"sftp put {names} -> {target}/wheels/ (sha256 checked on the node)",
                    f"{unpack.shell()} < node_install_wheels.py",
                    f"write {target}/{MARKER}",
                ),
                needs_sudo=True,
                details={"wheels": {w.filename: w.sha256 for w in wheels}},
            ),
            action,
        )

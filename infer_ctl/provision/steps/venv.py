"""The SGLang venv step (and the wheelhouse upload it depends on for air-gapped installs)."""

from __future__ import annotations

from infer_ctl.core.provision.driver import torch_cuda_fit
from infer_ctl.core.provision.lock import (
    MARKER_NAME,
    lock_path,
    locked_version,
    online_lock,
    sha256_hex,
    torch_cuda_of_lock,
    venv_dir,
    wheelhouse_dir,
)
from infer_ctl.core.provision.model import EntryKind
from infer_ctl.facts.gpu_driver import NVIDIA_SMI_BANNER, parse_cuda_version
from infer_ctl.provision.context import Planned, StepContext
from infer_ctl.provision.errors import ProvisionError, StepFailed, WheelhouseError
from infer_ctl.provision.remote_files import remove_files, run_checked, stale_temp_files, upload_file
from infer_ctl.provision.venv_links import installed_version, probe_venv, switch_current
from infer_ctl.provision.wheelhouse import LocalWheelhouse
from infer_ctl.remote.base import Command, Connector

_HASHES = 'cd -- "$1" 2>/dev/null || exit 0; for f in *; do [ -f "$f" ] && sha256sum -- "$f"; done; exit 0'


def shared_lock(ctx: StepContext) -> str | None:
    """The text of `sglang.lock_file` (read once per run by the runner), or None when none is set."""
    found = ctx.shared.get("lock")
    if isinstance(found, WheelhouseError):
        raise found
    return found if isinstance(found, str) else None


def local_wheelhouse(ctx: StepContext) -> LocalWheelhouse | None:
    """The verified local wheelhouse (loaded once per run by the runner), or None for PyPI installs."""
    found = ctx.shared.get("wheelhouse")
    if isinstance(found, WheelhouseError):
        raise found
    return found if isinstance(found, LocalWheelhouse) else None


def remote_hashes(conn: Connector, directory: str) -> dict[str, str]:
    result = conn.run(Command("sh", "-c", _HASHES, "sh", directory), sudo=True, timeout=600)
    if not result.ok:
        raise ProvisionError(f"cannot hash {directory} on {conn.node_name}: {result.err.strip()}")
    hashes = {}
    for line in result.out.splitlines():
        digest, _, name = line.partition("  ")
        if name:
            hashes[name] = digest
    return hashes


class WheelhouseStep:
    name = "wheelhouse"
    title = "air-gapped installs: upload the offline wheelhouse over SFTP and verify every sha256"
    needs_sudo = True

    def plan(self, ctx: StepContext) -> list[Planned]:
        try:
            local = local_wheelhouse(ctx)
        except WheelhouseError as exc:
            return [Planned(ctx.entry(self.name, "wheelhouse", EntryKind.ERROR, exc.message, remedy=exc.remedy))]
        if local is None:
            return [Planned(ctx.entry(self.name, "wheelhouse", EntryKind.SKIP, "no wheelhouse: the node installs from PyPI"))]
        remote_dir = wheelhouse_dir(ctx.profile.sglang.venv, local.lock)
        expected = local.expected_hashes()
        have = remote_hashes(ctx.conn, remote_dir)
        stale = sorted(name for name, digest in expected.items() if have.get(name) != digest)
        # parts and join files of an upload that was interrupted (upload_file), never hashed or used
        leftovers = stale_temp_files(ctx.conn, remote_dir)
        if not stale and leftovers:
            entry = ctx.entry(self.name, remote_dir, EntryKind.CHANGE,
                              f"{len(expected)} files verified; remove {len(leftovers)} leftover part(s) of an "
                              "interrupted upload", commands=(f"rm -f -- {' '.join(leftovers)}",), needs_sudo=True)  # fmt: skip
            return [Planned(entry, lambda: remove_files(ctx.conn, leftovers))]
        if not stale:
            return [Planned(ctx.entry(self.name, remote_dir, EntryKind.OK, f"{len(expected)} files verified"))]
        size = sum(local.files()[n].stat().st_size for n in stale)
        corrupt = [n for n in stale if n in have]

        def action() -> None:
            run_checked(ctx.conn, Command("mkdir", "-p", "--", remote_dir), sudo=True, what="mkdir wheelhouse")
            remove_files(ctx.conn, leftovers)
            for name in stale:
                upload_file(ctx.conn, local.files()[name], f"{remote_dir}/{name}", sudo=True)
            after = remote_hashes(ctx.conn, remote_dir)
            bad = sorted(n for n, d in expected.items() if after.get(n) != d)
            if bad:
                raise StepFailed(
                    self.name,
                    f"sha256 mismatch on the node after upload: {', '.join(bad[:3])}",
                    remedy="check the node's disk and rerun; the venv is not built from unverified wheels",
                )

        summary = f"upload {len(stale)} file(s), {size / 1e6:.1f} MB"
        if corrupt:
            summary += f" (replacing {len(corrupt)} with a wrong sha256 on the node)"
        return [
            Planned(
                ctx.entry(
                    self.name,
                    remote_dir,
                    EntryKind.CHANGE,
                    summary,
                    commands=(f"sftp put {len(stale)} file(s) -> {remote_dir}", f"sha256sum {remote_dir}/*"),
                    needs_sudo=True,
                    details={"files": stale},
                ),
                action,
            )
        ]


class VenvStep:
    name = "venv"
    title = "pinned SGLang venv <venvs>/sglang-<version>-<lockhash> and the atomic `current` symlink"
    needs_sudo = True

    def plan(self, ctx: StepContext) -> list[Planned]:
        sg = ctx.profile.sglang
        try:
            local = local_wheelhouse(ctx)
            locked = shared_lock(ctx)
        except WheelhouseError as exc:
            what = "lock refused" if "lock_file" in exc.message else "wheelhouse refused"
            return [Planned(ctx.entry(self.name, sg.venv, EntryKind.ERROR, f"{what}: {exc.message}", remedy=exc.remedy))]
        if local is not None and locked is not None and local.lock != locked:
            return [Planned(ctx.entry(self.name, sg.venv, EntryKind.ERROR,
                                      "the wheelhouse was not built from sglang.lock_file (their locks differ)",
                                      remedy="build it with `inferctl provision wheelhouse build --lock "
                                      "<sglang.lock_file>`"))]  # fmt: skip
        lock = local.lock if local else (locked or online_lock(sg.version))
        pinned = locked_version(lock)
        if pinned != sg.version:
            return [
                Planned(
                    ctx.entry(
                        self.name,
                        sg.venv,
                        EntryKind.ERROR,
                        f"the wheelhouse pins sglang {pinned or '(none)'}, the profile says {sg.version}",
                        remedy="build a wheelhouse for this version, or set sglang.version to the pinned one",
                    )
                )
            ]
        target = venv_dir(sg.venv, sg.version, lock)
        marker = sha256_hex(lock.encode())
        state = probe_venv(ctx.conn, sg.venv, target, sg.version)
        planned = [self._install(ctx, target, lock, marker, state.exists, state.marker, local, locked)]
        links_ok = state.current == target and state.alias == target
        if links_ok:
            planned.append(Planned(ctx.entry(self.name, f"{sg.venv}/current", EntryKind.OK, f"-> {target}")))
        else:

            def switch() -> None:
                switch_current(ctx.conn, sg.venv, target, sg.version)

            planned.append(
                Planned(
                    ctx.entry(
                        self.name,
                        f"{sg.venv}/current",
                        EntryKind.CHANGE,
                        "switch atomically (previous target kept for rollback)",
                        before=state.current or "<none>",
                        after=target,
                        commands=(f"ln -sfn {target} {sg.venv}/.current.new && mv -Tf … {sg.venv}/current",),
                        needs_sudo=True,
                    ),
                    switch,
                )
            )
        planned.extend(torch_cuda_entries(ctx, self.name, target, lock, built=state.marker == marker))
        return planned

    def _install(
        self,
        ctx: StepContext,
        target: str,
        lock: str,
        marker: str,
        exists: bool,
        have_marker: str | None,
        local: LocalWheelhouse | None,
        locked: str | None = None,
    ) -> Planned:
        sg = ctx.profile.sglang
        if have_marker == marker:
            version = installed_version(ctx.conn, target)
            if version == sg.version:
                return Planned(ctx.entry(self.name, target, EntryKind.OK, f"sglang {version} installed"))
            reason = f"venv reports sglang {version or 'not importable'}"
        else:
            reason = "incomplete (an interrupted install?)" if exists else "not built yet"
        pip = [f"{target}/bin/python", "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
        node_lock = lock_path(sg.venv, lock) if locked is not None and not local else None
        if local:
            remote_wh = wheelhouse_dir(sg.venv, lock)
            pip += ["--no-index", "--find-links", remote_wh, "--require-hashes", "-r", f"{remote_wh}/requirements.lock"]
        elif node_lock:
            # exactly the locked set, from the node's index: no resolution on the node
            pip += ["--require-hashes", "--no-deps", "-r", node_lock]
        else:
            pip += [f"sglang=={sg.version}"]
        commands = [Command(sg.python, "-m", "venv", target), Command(*pip)]
        if exists:
            commands.insert(0, Command("rm", "-rf", "--", target))

        def action() -> None:
            if not target.startswith(sg.venv.rstrip("/") + "/sglang-"):
                raise StepFailed(self.name, f"refusing to touch {target}: outside {sg.venv}")
            if node_lock:
                parent = node_lock.rsplit("/", 1)[0]
                run_checked(ctx.conn, Command("mkdir", "-p", "--", parent), sudo=True, what=f"mkdir {parent}")
                ctx.conn.put_file(node_lock, lock.encode(), mode=0o644, sudo=True)
            for command in commands:
                run_checked(ctx.conn, command, sudo=True, what=" ".join(command.argv[:4]), timeout=3600)
            version = installed_version(ctx.conn, target)
            if version != sg.version:
                raise StepFailed(self.name, f"built {target} but it reports sglang {version}")
            # the marker goes last: its presence means "complete"; see probe_venv
            ctx.conn.put_file(f"{target}/{MARKER_NAME}", marker.encode(), mode=0o644, sudo=True)

        return Planned(
            ctx.entry(
                self.name,
                target,
                EntryKind.CHANGE,
                f"build venv: {reason}",
                before=reason,
                after=f"sglang {sg.version}, lock {marker[:12]}",
                commands=(
                    *([f"write {node_lock}"] if node_lock else []),
                    *(c.shell() for c in commands),
                    f"write {target}/{MARKER_NAME}",
                ),
                needs_sudo=True,
            ),
            action,
        )


# the CUDA version torch was built for, read from its version.py without importing torch (seconds)
_TORCH_CUDA = (
    "import importlib.util, pathlib, re\n"
    "s = importlib.util.find_spec('torch')\n"
    "f = pathlib.Path(s.origin).with_name('version.py') if s and s.origin else None\n"
    "m = re.search(r\"^cuda(?::[^=]*)?=\\s*(?:'([^']*)'|None)\", f.read_text(), re.M) if f and f.exists() else None\n"
    "print('no-torch' if s is None else (m.group(1) or 'cpu') if m else 'unknown')\n"
)


def torch_cuda_entries(ctx: StepContext, step: str, target: str, lock: str, *, built: bool) -> list[Planned]:
    """Does the torch build fit the node's driver? torch's CUDA version (from the built venv, else from
    the lock's `+cuNNN` label) against the newest CUDA the driver supports (nvidia-smi's banner)."""
    if ctx.node.gpus == 0:
        return []
    torch_cuda = None
    if built:
        result = ctx.conn.run(Command(f"{target}/bin/python", "-c", _TORCH_CUDA), timeout=120)
        word = result.out.strip() if result.ok else ""
        torch_cuda = None if word in ("", "unknown", "no-torch") else word
    if torch_cuda is None:
        torch_cuda = torch_cuda_of_lock(lock)
    if torch_cuda is None or torch_cuda == "cpu":
        return []  # no torch, or a build without CUDA: nothing to match
    driver = parse_cuda_version(ctx.conn.run(NVIDIA_SMI_BANNER, timeout=60).out)
    if driver is None:
        return []  # the driver step reports a node without a working driver
    kind, why = torch_cuda_fit(torch_cuda, driver)
    subject = f"{target} torch CUDA"
    if kind == "ok":
        return [Planned(ctx.entry(step, subject, EntryKind.OK, why))]
    return [
        Planned(
            ctx.entry(
                step,
                subject,
                EntryKind.MANUAL if kind == "manual" else EntryKind.WARN,
                why,
                before=f"driver CUDA {driver}",
                after=f"torch CUDA {torch_cuda}",
                remedy="lock the torch build of the driver's CUDA (`inferctl provision lock` with "
                f"--pip-arg=--extra-index-url=https://download.pytorch.org/whl/cu{driver.replace('.', '')}), "
                "or upgrade the driver",
            )
        )
    ]

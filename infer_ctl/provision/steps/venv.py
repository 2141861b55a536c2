"""The SGLang venv step (and the wheelhouse upload it depends on for air-gapped installs)."""

from __future__ import annotations

from infer_ctl.core.provision.lock import (
    MARKER_NAME,
    locked_version,
    online_lock,
    sha256_hex,
    venv_dir,
    wheelhouse_dir,
)
from infer_ctl.core.provision.model import EntryKind
from infer_ctl.provision.context import Planned, StepContext
from infer_ctl.provision.errors import ProvisionError, StepFailed, WheelhouseError
from infer_ctl.provision.remote_files import remove_files, run_checked, stale_temp_files, upload_file
from infer_ctl.provision.venv_links import installed_version, probe_venv, switch_current
from infer_ctl.provision.wheelhouse import LocalWheelhouse
from infer_ctl.remote.base import Command, Connector

_HASHES = 'cd -- "$1" 2>/dev/null || exit 0; for f in *; do [ -f "$f" ] && sha256sum -- "$f"; done; exit 0'


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
        except WheelhouseError as exc:
            return [Planned(ctx.entry(self.name, sg.venv, EntryKind.ERROR, "wheelhouse refused", remedy=exc.remedy))]
        lock = local.lock if local else online_lock(sg.version)
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
        planned = [self._install(ctx, target, lock, marker, state.exists, state.marker, local)]
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
        if local:
            remote_wh = wheelhouse_dir(sg.venv, lock)
            pip += ["--no-index", "--find-links", remote_wh, "--require-hashes", "-r", f"{remote_wh}/requirements.lock"]
        else:
            pip += [f"sglang=={sg.version}"]
        commands = [Command(sg.python, "-m", "venv", target), Command(*pip)]
        if exists:
            commands.insert(0, Command("rm", "-rf", "--", target))

        def action() -> None:
            if not target.startswith(sg.venv.rstrip("/") + "/sglang-"):
                raise StepFailed(self.name, f"refusing to touch {target}: outside {sg.venv}")
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
                commands=(*(c.shell() for c in commands), f"write {target}/{MARKER_NAME}"),
                needs_sudo=True,
            ),
            action,
        )

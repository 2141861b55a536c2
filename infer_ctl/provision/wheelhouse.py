"""Offline wheelhouses: build one on a connected machine, load and verify one before upload.

`build_wheelhouse` runs `pip download` (binary wheels only, optionally for another platform/Python),
then pins every downloaded file by version and sha256 in `requirements.lock` and writes `manifest.json`.
A wheelhouse whose files do not match its manifest is refused before anything is uploaded.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from infer_ctl.core.provision.lock import (
    LOCK_NAME,
    MANIFEST_NAME,
    Manifest,
    make_lock,
    sha256_hex,
    verify_files,
)
from infer_ctl.provision.errors import WheelhouseError


@dataclass(frozen=True)
class LocalWheelhouse:
    path: Path
    lock: str
    manifest: Manifest

    def files(self) -> dict[str, Path]:
        """Every file to upload: the wheels, then the lock and the manifest."""
        out = {name: self.path / name for name in sorted(self.manifest.files)}
        out[LOCK_NAME] = self.path / LOCK_NAME
        out[MANIFEST_NAME] = self.path / MANIFEST_NAME
        return out

    def expected_hashes(self) -> dict[str, str]:
        hashes = dict(self.manifest.files)
        hashes[LOCK_NAME] = self.manifest.lock_sha256
        hashes[MANIFEST_NAME] = sha256_hex((self.path / MANIFEST_NAME).read_bytes())
        return hashes


def file_sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def load_wheelhouse(path: Path) -> LocalWheelhouse:
    """Read and verify a wheelhouse: every manifest file present with its sha256, lock hash matching."""
    manifest_path, lock_path = path / MANIFEST_NAME, path / LOCK_NAME
    if not manifest_path.is_file() or not lock_path.is_file():
        raise WheelhouseError(
            f"{path} is not an inferctl wheelhouse (needs {MANIFEST_NAME} and {LOCK_NAME})",
            remedy="build one with `inferctl provision wheelhouse build --out DIR` on a connected machine",
        )
    try:
        manifest = Manifest.from_json(manifest_path.read_text())
    except ValueError as exc:
        raise WheelhouseError(f"{manifest_path}: {exc}", remedy="rebuild the wheelhouse") from None
    lock = lock_path.read_text()
    if sha256_hex(lock.encode()) != manifest.lock_sha256:
        raise WheelhouseError(
            f"{lock_path} does not match the sha256 recorded in {MANIFEST_NAME}",
            remedy="the lock was edited or damaged: rebuild the wheelhouse, do not edit it by hand",
        )
    actual = {
        name: file_sha256(path / name) if (path / name).is_file() else None for name in manifest.files
    }
    bad = verify_files(manifest.files, actual)
    if bad:
        first = bad[0]
        got = actual[first] or "missing"
        raise WheelhouseError(
            f"wheelhouse {path}: {len(bad)} file(s) do not match the manifest, e.g. {first} "
            f"(expected sha256 {manifest.files[first][:16]}…, got {got[:16]}…); nothing was uploaded",
            remedy="copy the wheelhouse again from the build machine (or rebuild it) and rerun",
        )
    return LocalWheelhouse(path, lock, manifest)


def build_wheelhouse(
    out: Path,
    requirements: Sequence[str],
    *,
    pip_args: Sequence[str] = (),
    python: str = sys.executable,
) -> LocalWheelhouse:
    """Download binary wheels for `requirements` (and their dependencies) into `out`, pin them, verify."""
    out.mkdir(parents=True, exist_ok=True)
    argv = [python, "-m", "pip", "download", "--disable-pip-version-check", "--only-binary=:all:"]
    argv += ["-d", str(out), *pip_args, *requirements]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise WheelhouseError(
            f"pip download failed (exit {proc.returncode}): {' / '.join(tail)}",
            remedy="check the requirement pins, the index (--index-url/--find-links) and --platform/--python-version",
        )
    wheels = sorted(p for p in out.iterdir() if p.suffix == ".whl")
    if not wheels:
        raise WheelhouseError(f"pip downloaded no wheels into {out}", remedy="check the requirements")
    files = {p.name: file_sha256(p) for p in wheels}
    try:
        lock = make_lock(files)
    except ValueError as exc:
        raise WheelhouseError(str(exc), remedy="empty the output directory and build again") from None
    (out / LOCK_NAME).write_text(lock)
    manifest = Manifest(
        files=files,
        lock_sha256=sha256_hex(lock.encode()),
        requirements=tuple(requirements),
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    (out / MANIFEST_NAME).write_text(manifest.to_json())
    return load_wheelhouse(out)

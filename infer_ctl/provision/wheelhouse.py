"""Offline wheelhouses: build one on a connected machine, load and verify one before upload.

`build_wheelhouse` runs `pip download` (binary wheels only, optionally for another platform/Python),
then pins every downloaded file by version and sha256 in `requirements.lock` and writes `manifest.json`.
A wheelhouse whose files do not match its manifest is refused before anything is uploaded.
"""

from __future__ import annotations

import json
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
    lock_entries,
    lock_from_pip_report,
    make_lock,
    parse_wheel_filename,
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


def _locked(lock: str, files: dict[str, str]) -> str:
    """The lock, after checking that the downloaded files are exactly the ones it pins."""
    entries = lock_entries(lock)
    for filename, digest in files.items():
        name, _ = parse_wheel_filename(filename)
        if name not in entries or digest not in entries[name][1]:
            raise ValueError(f"{filename} (sha256 {digest[:16]}…) is not pinned by the lock")
    missing = sorted(set(entries) - {parse_wheel_filename(f)[0] for f in files})
    if missing:
        raise ValueError(f"the lock pins {', '.join(missing)}, which pip did not download")
    return lock


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


def _pip(argv: list[str], what: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise WheelhouseError(
            f"{what} failed (exit {proc.returncode}): {' / '.join(tail)}",
            remedy="check the requirement pins, the index (--index-url/--find-links) and --platform/--python-version",
        )


def build_lock(
    out: Path, requirements: Sequence[str], *, pip_args: Sequence[str] = (), python: str = sys.executable
) -> str:
    """Resolve `requirements` once, here, with pip (`install --dry-run --report`: nothing is installed)
    and write the lockfile of that resolution to `out`: every package, its version and the sha256 of the
    wheel chosen. `pip_args` select the nodes' platform (`--platform`, `--python-version`, an
    `--extra-index-url` for CUDA builds of torch), as for `wheelhouse build`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    report = out.with_name(f".{out.name}.report.json")
    argv = [python, "-m", "pip", "install", "--disable-pip-version-check", "--dry-run", "--ignore-installed",
            "--quiet", "--only-binary=:all:", "--report", str(report), *pip_args, *requirements]  # fmt: skip
    try:
        _pip(argv, "pip install --dry-run --report")
        lock = lock_from_pip_report(json.loads(report.read_text()))
    except ValueError as exc:
        raise WheelhouseError(str(exc), remedy="lock released packages (name==version) only") from None
    finally:
        report.unlink(missing_ok=True)
    out.write_text(lock)
    return lock


def build_wheelhouse(
    out: Path,
    requirements: Sequence[str],
    *,
    pip_args: Sequence[str] = (),
    python: str = sys.executable,
    lock_file: Path | None = None,
) -> LocalWheelhouse:
    """Download binary wheels for `requirements` (and their dependencies) into `out`, pin them, verify.
    With `lock_file` (`provision lock`): exactly the files it pins, no resolution, and the lock itself
    becomes the wheelhouse's `requirements.lock` byte for byte, so its nodes build the same venv
    (`<venvs>/sglang-<version>-<lockhash>`) as nodes installing from an index with that lock."""
    out.mkdir(parents=True, exist_ok=True)
    argv = [python, "-m", "pip", "download", "--disable-pip-version-check", "--only-binary=:all:"]
    if lock_file is not None:
        argv += ["--no-deps", "--require-hashes", "-r", str(lock_file)]
    argv += ["-d", str(out), *pip_args, *requirements]
    _pip(argv, "pip download")
    wheels = sorted(p for p in out.iterdir() if p.suffix == ".whl")
    if not wheels:
        raise WheelhouseError(f"pip downloaded no wheels into {out}", remedy="check the requirements")
    files = {p.name: file_sha256(p) for p in wheels}
    try:
        lock = make_lock(files) if lock_file is None else _locked(lock_file.read_text(), files)
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

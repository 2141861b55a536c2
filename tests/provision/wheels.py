"""Tiny real wheels built at test time (zip + dist-info, as the wheel spec describes): a stand-in
`sglang` that depends on `tinydep`. pip installs them like any wheel; they just contain no SGLang."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(
    out: Path, name: str, version: str, requires: list[str] | None = None, extra: dict[str, bytes] | None = None
) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"__version__ = {version!r}\n".encode(),
        **(extra or {}),
        f"{dist}/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            + "".join(f"Requires-Dist: {r}\n" for r in requires or [])
        ).encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: inferctl-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [_record_line(n, d) for n, d in files.items()] + [f"{dist}/RECORD,,"]
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = out / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for n, d in files.items():
            zf.writestr(n, d)
    return path


def build_index(out: Path, sglang_version: str) -> Path:
    """A --find-links directory holding the stand-in sglang and its dependency."""
    build_wheel(out, "tinydep", "1.0")
    build_wheel(out, "sglang", sglang_version, ["tinydep>=1.0"])
    return out


def make_wheelhouse(out: Path, version: str) -> Path:
    """The layout `inferctl provision wheelhouse build` writes, without running pip (fast): the real
    build is exercised once in the end-to-end test."""
    from infer_ctl.core.provision.lock import LOCK_NAME, MANIFEST_NAME, Manifest, make_lock, sha256_hex

    build_index(out, version)
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.glob("*.whl"))}
    lock = make_lock(files)
    (out / LOCK_NAME).write_text(lock)
    manifest = Manifest(files=files, lock_sha256=sha256_hex(lock.encode()), requirements=(f"sglang=={version}",))
    (out / MANIFEST_NAME).write_text(manifest.to_json())
    return out

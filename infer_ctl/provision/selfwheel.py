"""Wheels of inferctl itself (and nvidia-ml-py when present) built on the controller, for the nodes.

The node needs inferctl's package only as a home for its node-side gatherers (run by a plain
interpreter), so the wheel is made from the package files this controller runs, whether installed
from a wheel or editable from a checkout: no build backend, no network, and the node gets exactly the
code that gathers its facts. The zip is deterministic (sorted names, fixed timestamps), so the same code
always gives the same sha256 and an unchanged node plans OK.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import io
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import infer_ctl

#: the distribution that gives the GPU gatherer NVML (imports as `pynvml`); shipped when installed here
NVML_DIST = "nvidia-ml-py"
_EPOCH = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class BuiltWheel:
    filename: str
    data: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def make_wheel(dist: str, version: str, files: Iterable[tuple[str, bytes]], summary: str) -> BuiltWheel:
    """A pure-Python `py3-none-any` wheel holding `files` (archive name -> bytes), RECORD included."""
    stem = f"{dist.replace('-', '_')}-{version}"
    info = f"{stem}.dist-info"
    content = dict(sorted(files))
    content[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\nSummary: {summary}\n".encode()
    content[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: inferctl\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = [_record_line(name, data) for name, data in content.items()] + [f"{info}/RECORD,,"]
    content[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in content.items():
            item = zipfile.ZipInfo(name, date_time=_EPOCH)
            item.external_attr = 0o644 << 16
            item.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(item, data)
    return BuiltWheel(f"{stem}-py3-none-any.whl", buf.getvalue())


def _package_files(root: Path, prefix: str) -> list[tuple[str, bytes]]:
    out = []
    for path in sorted(root.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts or path.suffix in {".pyc", ".pyo"}:
            continue
        out.append((f"{prefix}/{path.relative_to(root).as_posix()}", path.read_bytes()))
    return out


def inferctl_wheel() -> BuiltWheel:
    root = Path(infer_ctl.__file__).parent
    return make_wheel(
        "inferctl",
        infer_ctl.__version__,
        _package_files(root, "infer_ctl"),
        "inferctl node-side package (gatherers), installed by inferctl provision",
    )


def installed_pure_wheel(dist_name: str) -> BuiltWheel | None:
    """Re-pack a pure-Python distribution installed here (from its RECORD), or None if absent."""
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        return None
    files = []
    for item in dist.files or []:
        parts = item.parts
        if not parts or parts[0].endswith(".dist-info") or "__pycache__" in parts or parts[0] == "..":
            continue
        if item.suffix in {".pyc", ".so", ".pyd"}:
            return None  # not pure Python: the node's interpreter may differ, do not ship it
        located = Path(str(item.locate()))
        if located.is_file():
            files.append((item.as_posix(), located.read_bytes()))
    if not files:
        return None
    return make_wheel(dist_name, dist.version, files, dist.metadata["Summary"] or dist_name)


def node_wheels() -> list[BuiltWheel]:
    """inferctl, plus nvidia-ml-py when this controller has it (the GPU gatherer then reads NVML)."""
    wheels = [inferctl_wheel()]
    nvml = installed_pure_wheel(NVML_DIST)
    if nvml is not None:
        wheels.append(nvml)
    return wheels


def bundle_id(wheels: Iterable[BuiltWheel]) -> str:
    """The sha256 over every wheel's name and sha256: the venv's marker and directory suffix."""
    digest = hashlib.sha256()
    for wheel in wheels:
        digest.update(f"{wheel.filename} {wheel.sha256}\n".encode())
    return digest.hexdigest()

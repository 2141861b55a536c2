"""Pinned SGLang environments: lockfiles, wheelhouse manifests, and the versioned venv name.

A venv lives in `<venvs>/sglang-<version>-<lockhash>` and is never modified after it is built: a new lock
means a new directory, so switching (and rolling back) is one atomic symlink swap of `<venvs>/current`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

LOCK_NAME = "requirements.lock"
MANIFEST_NAME = "manifest.json"
#: written last into a finished venv; its absence marks a venv an interrupted apply left behind
MARKER_NAME = ".inferctl-lock.sha256"

_WHEEL_RE = re.compile(r"^(?P<name>[A-Za-z0-9_.]+?)-(?P<version>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical_name(name: str) -> str:
    """PEP 503 normalization: `Foo_Bar.baz` and `foo-bar-baz` are the same project."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_wheel_filename(filename: str) -> tuple[str, str]:
    match = _WHEEL_RE.match(filename)
    if not match:
        raise ValueError(f"{filename!r} is not a wheel file name (name-version-tag.whl)")
    return canonical_name(match["name"]), match["version"]


def make_lock(files: Mapping[str, str]) -> str:
    """A `pip install --require-hashes` lockfile pinning every wheel (filename -> sha256) by version and hash."""
    pins: dict[str, tuple[str, set[str]]] = {}
    for filename, digest in files.items():
        name, version = parse_wheel_filename(filename)
        have = pins.get(name)
        if have and have[0] != version:
            raise ValueError(f"two versions of {name} in the wheelhouse: {have[0]} and {version}")
        pins.setdefault(name, (version, set()))[1].add(digest)
    lines = []
    for name in sorted(pins):
        version, digests = pins[name]
        hashes = " ".join(f"--hash=sha256:{d}" for d in sorted(digests))
        lines.append(f"{name}=={version} {hashes}")
    return "\n".join(lines) + "\n"


def lock_from_pip_report(report: Mapping[str, Any]) -> str:
    """The lockfile of a `pip install --dry-run --report` resolution (pip's installation report,
    https://pip.pypa.io/en/stable/reference/installation-report/): every package pip would install,
    pinned by version and the sha256 of the file it chose. Made once on one machine, it is the whole
    dependency set every node installs (`pip install --require-hashes --no-deps -r`), so nodes do not
    each resolve SGLang's dependencies on their own and end up with different versions."""
    pins: dict[str, tuple[str, set[str]]] = {}
    for item in report.get("install") or []:
        meta = item.get("metadata") or {}
        name, version = canonical_name(str(meta.get("name", ""))), str(meta.get("version", ""))
        archive = (item.get("download_info") or {}).get("archive_info") or {}
        digest = (archive.get("hashes") or {}).get("sha256")
        if not digest and str(archive.get("hash", "")).startswith("sha256="):
            digest = str(archive["hash"]).split("=", 1)[1]
        if not name or not version or not digest:
            url = (item.get("download_info") or {}).get("url", "?")
            raise ValueError(f"{name or url}: pip's report gives no version and sha256 of a file (a local "
                             "directory or VCS requirement?); a lock pins released files only")  # fmt: skip
        pins.setdefault(name, (version, set()))[1].add(digest)
    if not pins:
        raise ValueError("pip's report lists nothing to install")
    lines = [f"{n}=={v} " + " ".join(f"--hash=sha256:{d}" for d in sorted(ds)) for n, (v, ds) in sorted(pins.items())]
    return "\n".join(lines) + "\n"


def lock_entries(lock: str) -> dict[str, tuple[str, set[str]]]:
    """name -> (version, sha256s) of a lockfile's `name==version --hash=sha256:...` lines."""
    out: dict[str, tuple[str, set[str]]] = {}
    for line in lock.splitlines():
        words = line.split()
        if not words or words[0].startswith("#") or "==" not in words[0]:
            continue
        name, version = words[0].split("==", 1)
        hashes = {w.split(":", 1)[1] for w in words[1:] if w.startswith("--hash=sha256:")}
        out[canonical_name(name)] = (version, hashes)
    return out


def torch_cuda_of_lock(lock: str) -> str | None:
    """The CUDA version of the torch build a lock pins, from its local version label (`2.13.0+cu129` ->
    "12.9"); "cpu" for a CPU build; None when the lock pins no torch or one without a label (PyPI's
    default build, whose CUDA version is only known once installed)."""
    entry = lock_entries(lock).get("torch")
    if entry is None:
        return None
    _, _, label = entry[0].partition("+")
    if label == "cpu":
        return "cpu"
    m = re.fullmatch(r"cu(\d+)(\d)", label)
    return f"{int(m[1])}.{m[2]}" if m else None


def online_lock(version: str) -> str:
    """Without a wheelhouse the pin is the SGLang version alone, resolved from PyPI by the node."""
    return f"sglang=={version}\n"


def lock_hash(lock: str) -> str:
    """Short, stable id of a lock: the venv directory suffix (12 hex chars of sha256)."""
    return sha256_hex(lock.encode())[:12]


def venv_dir(venvs: str, version: str, lock: str) -> str:
    return f"{venvs.rstrip('/')}/sglang-{version}-{lock_hash(lock)}"


def wheelhouse_dir(venvs: str, lock: str) -> str:
    """Uploaded wheelhouses sit beside the venvs, keyed by lock so two versions never mix files."""
    parent = venvs.rstrip("/").rsplit("/", 1)[0] or "/"
    return f"{parent.rstrip('/')}/wheelhouse/{lock_hash(lock)}"


def lock_path(venvs: str, lock: str) -> str:
    """Where a node keeps the lock it installs from an index (`pip install -r` reads a file)."""
    parent = venvs.rstrip("/").rsplit("/", 1)[0] or "/"
    return f"{parent.rstrip('/')}/locks/{lock_hash(lock)}.lock"


def locked_version(lock: str, package: str = "sglang") -> str | None:
    want = canonical_name(package)
    for line in lock.splitlines():
        spec = line.split()[0] if line.split() else ""
        if "==" in spec and canonical_name(spec.split("==")[0]) == want:
            return spec.split("==", 1)[1]
    return None


@dataclass(frozen=True)
class Manifest:
    """What `wheelhouse build` produced: every file with its sha256, plus the lock's own hash."""

    files: Mapping[str, str]
    lock_sha256: str
    requirements: tuple[str, ...] = ()
    created_at: str = ""

    def to_json(self) -> str:
        doc: dict[str, Any] = {
            "format": 1,
            "created_at": self.created_at,
            "requirements": list(self.requirements),
            "lock_sha256": self.lock_sha256,
            "files": dict(sorted(self.files.items())),
        }
        return json.dumps(doc, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        try:
            doc = json.loads(text)
            files = {str(k): str(v) for k, v in doc["files"].items()}
            return cls(
                files=files,
                lock_sha256=str(doc["lock_sha256"]),
                requirements=tuple(doc.get("requirements", [])),
                created_at=str(doc.get("created_at", "")),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not an inferctl wheelhouse manifest: {exc}") from None


def verify_files(expected: Mapping[str, str], actual: Mapping[str, str | None]) -> list[str]:
    """Names whose actual sha256 differs from the manifest (None = file missing)."""
    return sorted(name for name, digest in expected.items() if actual.get(name) != digest)

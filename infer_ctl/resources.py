"""Files shipped with inferctl (example profiles, templates), found both in a source checkout
(editable install) and in an installed wheel (copied under infer_ctl/_data)."""

from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent


def _data_dir(name: str) -> Path:
    installed = _PKG / "_data" / name
    if installed.is_dir():
        return installed
    return _PKG.parent / name


def profiles_dir() -> Path:
    return _data_dir("profiles")


def templates_dir() -> Path:
    return _data_dir("templates")


def builtin_profile_names() -> list[str]:
    return sorted(p.stem for p in profiles_dir().glob("*.yaml"))


def builtin_profile_path(name: str) -> Path | None:
    path = profiles_dir() / f"{name}.yaml"
    return path if path.is_file() else None

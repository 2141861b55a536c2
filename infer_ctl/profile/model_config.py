"""The target model's config.json, when its path is a directory on this machine (a local checkout or a
shared filesystem the controller mounts): `profile validate` and `launch --dry-run` read the KV shape
from it when the profile names no preset. None when it is not there or not JSON: the model usually
lives on the nodes only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from infer_ctl.profile.profile import Profile


def local_model_config(profile: Profile) -> dict[str, Any] | None:
    target = profile.models.target if profile.models else None
    if target is None:
        return None
    path = Path(target.path).expanduser()
    if not path.is_absolute():
        path = profile.base_dir / path
    try:
        data = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None

"""Where inferctl keeps its own state on the controller: `$XDG_STATE_HOME/inferctl`
(default `~/.local/state/inferctl`, per the XDG Base Directory specification,
https://specifications.freedesktop.org/basedir-spec/latest/). Ground floor: stdlib only, so the CLI
boundary (debug log) and the fleet (accepted host keys) share one definition."""

from __future__ import annotations

import os
from pathlib import Path


def state_dir() -> Path:
    """inferctl's state directory; not created here (writers create it when they first write)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "inferctl"

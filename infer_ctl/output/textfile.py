"""Prometheus textfiles (node_exporter textfile collector), written atomically."""

from __future__ import annotations

import os
from pathlib import Path

from infer_ctl.atomicfile import write_atomic


def write_textfile(path: str | os.PathLike[str], text: str) -> Path:
    """Write a node_exporter textfile (*.prom) atomically."""
    return write_atomic(path, text)

"""Fleet mode: sha256 of the tokenizer files on a node, computed there (only hashes travel back, never the
files), and the same hashes of a local copy."""

from __future__ import annotations

import shlex
from pathlib import Path

from infer_ctl.facts.tokenizer.files import TOKENIZER_FILES, sha256_bytes, tokenizer_file_names
from infer_ctl.remote.base import Command

NO_DIR_MARKER = "__inferctl_no_such_directory__"


def tokenizer_hash_command(directory: str) -> Command:
    """sha256 of the tokenizer files in `directory` on a node."""
    names = " ".join(shlex.quote(n) for n in TOKENIZER_FILES)
    # "~/x" means the node's home (quoting would stop the shell expanding it), anything else is literal
    where = f'"$HOME"/{shlex.quote(directory[2:])}' if directory.startswith("~/") else shlex.quote(directory)
    script = (
        f"cd -- {where} 2>/dev/null || {{ echo {NO_DIR_MARKER}; exit 0; }}; "
        f"for f in {names} *.tiktoken; do if [ -f \"$f\" ]; then sha256sum -- \"$f\" || exit 1; fi; done"
    )
    return Command.sh(script)


def parse_sha256sum(text: str) -> dict[str, str] | None:
    """`sha256sum` lines ("<hex>  <name>") -> {name: hex}; None when the directory does not exist."""
    if NO_DIR_MARKER in text:
        return None
    hashes: dict[str, str] = {}
    for line in text.splitlines():
        digest, sep, name = line.partition("  ")
        if not sep:
            digest, sep, name = line.partition(" *")  # binary-mode marker
        if sep and len(digest) == 64:
            hashes[name.strip()] = digest.lower()
    return hashes


def local_hashes(directory: str | Path) -> dict[str, str] | None:
    """The same hashes as `tokenizer_hash_command`, computed on this machine."""
    path = Path(directory).expanduser()
    if not path.is_dir():
        return None
    names = tokenizer_file_names(path)
    return {n: sha256_bytes((path / n).read_bytes()) for n in names if (path / n).is_file()}

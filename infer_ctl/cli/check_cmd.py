"""`inferctl check <family>`: one family of health checks. Families add themselves to `app` from their
own modules (cli/check_gpu.py, cli/check_fabric.py, ...), imported by cli/main.py."""

from __future__ import annotations

import typer

app = typer.Typer(help="Run one family of health checks (gpu, fabric, tokenizer, servers, spec).", no_args_is_help=True)

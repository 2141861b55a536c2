"""`inferctl profile init`: write a commented first profile from a few flags (issue 29, item 8)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from infer_ctl.atomicfile import write_atomic
from infer_ctl.errors import ProfileError, UsageError
from infer_ctl.profile.load import parse_profile_text
from infer_ctl.profile.starter import Starter, parse_nodes, render

_NODE_HELP = "NAME=HOST (or HOST: named {p}-01, {p}-02, ...); repeatable."


def init(
    prefill: Annotated[list[str] | None, typer.Option("--prefill", metavar="NAME=HOST", help="A prefill node: " + _NODE_HELP.format(p="pf"))] = None,
    decode: Annotated[list[str] | None, typer.Option("--decode", metavar="NAME=HOST", help="A decode node: " + _NODE_HELP.format(p="dc"))] = None,
    mixed: Annotated[list[str] | None, typer.Option("--mixed", metavar="NAME=HOST", help="A node serving both roles in one collocated server: " + _NODE_HELP.format(p="node"))] = None,
    gpus: Annotated[int, typer.Option("--gpus", min=0, max=64, help="GPUs of each node.")] = 8,
    model: Annotated[str, typer.Option("--model", "-m", metavar="PATH", help="The target model: its path on the nodes (models.target.path).")] = "/models/Llama-3.1-8B-Instruct",
    tp: Annotated[int | None, typer.Option("--tp", min=1, max=64, help="Tensor-parallel ranks per server (default: --gpus).")] = None,
    name: Annotated[str, typer.Option("--name", help="The profile's name.")] = "my-cluster",
    user: Annotated[str | None, typer.Option("--user", help="SSH login on the nodes (default: yours).")] = None,
    out: Annotated[str, typer.Option("--out", "-o", metavar="PATH", help="Where to write it; - for stdout.")] = "inferctl.yaml",
    force: Annotated[bool, typer.Option("--force", help="Replace an existing file.")] = False,
) -> None:
    """Write a commented starting profile for your nodes; it passes `inferctl profile validate`. Refuses to
    replace an existing file unless --force; the file appears whole or not at all."""
    nodes = [*parse_nodes("prefill", prefill or []), *parse_nodes("decode", decode or []),
             *parse_nodes("mixed", mixed or [])]
    text = render(Starter(name=name, nodes=nodes, gpus=gpus, model=model, tp=tp, user=user))
    try:  # what validate would say, before anything is written: a bad NAME or HOST is named here
        parse_profile_text(text, origin="profile init")
    except ProfileError as exc:
        raise UsageError("the flags make an invalid profile: " + "; ".join(exc.errors), remedy="see --help") from exc
    if out == "-":
        sys.stdout.write(text)
        raise typer.Exit(0)
    try:
        path = write_atomic(Path(out), text, exclusive=not force)
    except FileExistsError:
        raise UsageError(f"{out} exists; not replaced", remedy="give --force to replace it, or --out another path") from None
    typer.echo(f"wrote {path}: {len(nodes)} nodes; next: inferctl profile validate -p {path}", err=True)
    raise typer.Exit(0)

"""`--help` shows the way: an example on every command, one placeholder style, no
`<bool>` on switches, root help fast (it imports no command module) and not broken mid-sentence."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from infer_ctl.cli.examples import EXAMPLES
from infer_ctl.cli.main import click_command, main, summary_app
from tests.cli.tree import commands, groups, root

ROOT = Path(__file__).resolve().parents[2]
ALL = sorted({p for p, _ in commands()} | {p for p, _ in groups()})


def _resolve(words: list[str]) -> tuple[str, object, list[str]]:
    """The deepest command the words name, its path and the arguments left for it."""
    cmd, path = root(), []
    while words and getattr(cmd, "commands", None) and words[0] in cmd.commands:
        cmd = cmd.commands[words[0]]
        path.append(words.pop(0))
    return " ".join(path), cmd, words


def test_every_command_has_an_example() -> None:
    assert [p for p in ALL if not EXAMPLES.get(p)] == []
    assert sorted(set(EXAMPLES) - set(ALL)) == []  # no example for a command that no longer exists


#: the examples that need no cluster, router or file: pure sizing math, run whole
OFFLINE = sorted({line for p in EXAMPLES if p.startswith("plan") for line in EXAMPLES[p]})


@pytest.mark.parametrize("line", OFFLINE)
def test_every_sizing_example_runs(line: str, capsys: pytest.CaptureFixture[str]) -> None:
    # parsing is not enough: `plan cost --scenario seed` and `plan tiers --accelerator h100` parsed, then
    # exited 64 (unknown scenario, unknown preset)
    code = main(shlex.split(line)[1:])
    assert code in (0, 1), capsys.readouterr().err


@pytest.mark.parametrize(("path", "line"), [(p, line) for p in sorted(EXAMPLES) for line in EXAMPLES[p]])
def test_every_example_parses(path: str, line: str) -> None:
    # an example is a real command line: it names its command and only options (and values) it takes
    words = shlex.split(line)
    assert words[0] == "inferctl"
    for shell in ("|", ">"):  # the shell's part of the line is not inferctl's
        if shell in words:
            words = words[: words.index(shell)]
    resolved, cmd, rest = _resolve(words[1:])
    assert resolved.startswith(path)
    ctx = cmd.make_context(resolved or "inferctl", rest)  # type: ignore[attr-defined]
    ctx.close()


@pytest.mark.parametrize("path", ALL)
def test_help_has_examples_and_one_placeholder_style(path: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*path.split(), "--help"]) == 0
    text = capsys.readouterr().out
    assert "Examples:" in text and "inferctl" in text.split("Examples:")[1]
    # typer's own labels: <bool> beside a switch, <list[str]>, <int range> [x>=1024], {command}...
    for bad in ("<bool>", "<str>", "<int", "<float>", "<path>", "<list[", "[x>=", "[x<=", "<=x"):
        assert bad not in text, f"{path} --help shows {bad!r}"
    usage = next(line for line in text.splitlines() if "Usage:" in line)
    assert "{" not in usage


def test_root_help_is_the_commands_summaries() -> None:
    # root help prints cli/summaries.py without importing the verbs: the lines are the loaded commands'
    def lines(cmd: object) -> list[tuple[str, str]]:
        return [(n, c.help.split("\n\n")[0]) for n, c in cmd.commands.items()]  # type: ignore[attr-defined]

    assert lines(click_command(summary_app())) == lines(root())


def test_root_help_imports_no_command_module() -> None:
    code = (
        "import sys, json\nfrom infer_ctl.cli.main import main\nrc = main(['--help'])\n"
        "sys.stderr.write(json.dumps([rc, sorted(sys.modules)]))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    rc, modules = json.loads(done.stderr)
    assert rc == 0
    heavy = [m for m in modules if m.endswith("_cmd") or m.split(".")[0] in ("paramiko", "aiohttp", "pydantic")
             or m.startswith(("infer_ctl.profile", "infer_ctl.router", "infer_ctl.sim"))]
    assert heavy == []


def test_root_help_keeps_each_summary_on_its_lines(capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # the docstrings' source line breaks cut sentences ("control sequences in it are" / "shown as ...")
    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.setenv("TERMINAL_WIDTH", "250")
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "control sequences in it are shown as escapes" in out
    assert "route a shared-prefix bench through the router, print" in out

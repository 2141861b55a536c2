"""`$INFERCTL_PROFILE` and `-p` behave identically in every command: built from the
command tree, so a new command that takes a profile is covered without editing this file."""

from __future__ import annotations

from typing import Any

import pytest

from infer_ctl.cli.main import main
from tests.cli.tree import commands, options


def _profile_option(cmd: Any) -> Any | None:
    return next((o for o in options(cmd) if "--profile" in o.opts), None)


PROFILE_COMMANDS = [(path, cmd) for path, cmd in commands() if _profile_option(cmd) is not None]


def _parsed(cmd: Any, argv: list[str]) -> Any:
    ctx = cmd.make_context(cmd.name, argv, resilient_parsing=True)
    return ctx.params[_profile_option(cmd).name]


def test_the_tree_has_profile_commands() -> None:
    assert len(PROFILE_COMMANDS) > 25


@pytest.mark.parametrize(("path", "cmd"), PROFILE_COMMANDS, ids=[p for p, _ in PROFILE_COMMANDS])
def test_env_and_flag_give_the_command_the_same_profile(path: str, cmd: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INFERCTL_PROFILE", raising=False)
    by_flag = _parsed(cmd, ["-p", "/x/p.yaml"])
    monkeypatch.setenv("INFERCTL_PROFILE", "/x/p.yaml")
    assert _parsed(cmd, []) == by_flag == "/x/p.yaml"
    assert _parsed(cmd, ["-p", "/y/q.yaml"]) == "/y/q.yaml"  # the flag still wins over the variable


def test_router_serve_with_workers_takes_listen_from_the_env_profile(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Any) -> None:
    # with workers on the command line, $INFERCTL_PROFILE was ignored (127.0.0.1:8000) while -p was not
    from infer_ctl.resources import builtin_profile_path
    from infer_ctl.router.daemon import procs

    local = builtin_profile_path("local")
    assert local is not None
    prof = tmp_path / "p.yaml"
    prof.write_text(local.read_text().replace("listen: 127.0.0.1:8000", "listen: 127.0.0.1:8177"))
    seen: list[Any] = []
    monkeypatch.setattr(procs, "serve", lambda cfg, n, level: seen.append(cfg) or 0)
    monkeypatch.setenv("INFERCTL_PROFILE", str(prof))
    assert main(["router", "serve", "--mixed", "http://127.0.0.1:9"]) == 0
    monkeypatch.delenv("INFERCTL_PROFILE")
    assert main(["router", "serve", "-p", str(prof), "--mixed", "http://127.0.0.1:9"]) == 0
    assert [(c.host, c.port) for c in seen] == [("127.0.0.1", 8177)] * 2


@pytest.mark.parametrize("argv", [["profile", "validate"], ["profile", "show"], ["nodes"], ["status"]])
def test_a_missing_profile_names_where_its_path_came_from(argv: list[str], monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    # the variable's path was blamed on "--profile", which the user never typed
    monkeypatch.setenv("INFERCTL_PROFILE", "/nonexistent/p.yaml")
    assert main(argv) == 64
    assert "/nonexistent/p.yaml (from $INFERCTL_PROFILE) does not exist" in capsys.readouterr().err
    assert main([*argv, "-p", "/nonexistent/q.yaml"]) == 64
    assert "/nonexistent/q.yaml (from --profile) does not exist" in capsys.readouterr().err

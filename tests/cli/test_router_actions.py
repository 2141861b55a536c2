"""`router workers|prefixes ACTION`: a typo in ACTION, a missing URL/NAME or an out-of-range --replicas is a
usage error that says so (with "did you mean"), before any profile is read or router asked: without a
profile a typo used to read "no profile given and ./inferctl.yaml does not exist"."""

from __future__ import annotations

import pytest

from infer_ctl.cli.main import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["router", "prefixes", "lst"], "bad prefixes action 'lst' (did you mean 'list'?)"),
        (["router", "workers", "ad", "http://w:1"], "bad workers action 'ad' (did you mean 'add'?)"),
        (["router", "workers", "zzz"], "bad workers action 'zzz' (one of list, add, remove, drain, undrain)"),
        (["router", "workers", "drain"], "workers drain needs a worker URL"),
        (["router", "workers", "add", "http://w:1"], "workers add needs --role"),
        (["router", "prefixes", "warm"], "prefixes warm needs a prefix NAME"),
        (["router", "prefixes", "add", "p", "--text", "x", "--replicas", "0"], "--replicas must be 1 to 64, got 0"),
    ],
)
def test_action_mistakes_are_named_before_any_profile(
    argv: list[str], message: str, tmp_path: object, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(str(tmp_path))  # no ./inferctl.yaml
    monkeypatch.delenv("INFERCTL_PROFILE", raising=False)
    assert main(argv) == 64
    err = capsys.readouterr().err
    assert err.startswith(f"inferctl: error: {message}"), err
    assert "no profile given" not in err

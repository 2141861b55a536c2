"""`router workers|prefixes ACTION`: a typo in ACTION, a missing URL/NAME or an out-of-range --replicas is a
usage error that says so (with "did you mean"), before any profile is read or router asked: without a
profile a typo used to read "no profile given and ./inferctl.yaml does not exist"."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

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


def test_a_busy_listen_address_from_the_profile_names_router_listen(tmp_path: Path) -> None:
    # the hint said "pick another --listen" to a user who never gave one: the address was the profile's
    from infer_ctl.resources import builtin_profile_path

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    local = builtin_profile_path("local")
    assert local is not None
    prof = tmp_path / "p.yaml"
    prof.write_text(local.read_text().replace("listen: 127.0.0.1:8000", f"listen: 127.0.0.1:{busy.getsockname()[1]}"))
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    try:
        proc = subprocess.run([sys.executable, "-m", "infer_ctl", "router", "serve", "-p", str(prof)],
                              capture_output=True, text=True, timeout=60, env=env, check=False)
    finally:
        busy.close()
    assert proc.returncode == 64, proc.stderr
    assert "address already in use" in proc.stderr and "the profile's router.listen" in proc.stderr

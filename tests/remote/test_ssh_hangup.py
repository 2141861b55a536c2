"""A peer that accepts TCP and hangs up before the SSH banner is not a slow one: no sshd is needed."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from infer_ctl.remote.errors import ConnectTimeoutError, UnreachableError
from infer_ctl.remote.hostkeys import HostKeyStore
from infer_ctl.remote.ssh import KeyRing, open_transport
from infer_ctl.remote.target import SshTarget


def test_a_peer_that_hangs_up_at_once_is_not_blamed_on_a_timeout(tmp_path):
    # what sshd's MaxStartups, tcp_wrappers or a closing proxy do: accept, then close without a greeting
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]

    def hang_up() -> None:
        with server:
            conn, _ = server.accept()
            conn.close()

    threading.Thread(target=hang_up, daemon=True).start()
    target = SshTarget(label="n1", host="127.0.0.1", port=port, user="u", known_hosts_files=())
    store = HostKeyStore(tmp_path / "known_hosts", tmp_path / "accepted")
    start = time.monotonic()
    with pytest.raises(UnreachableError) as info:
        open_transport(target, store, KeyRing(use_agent=False), timeout=20, keepalive=0)
    assert time.monotonic() - start < 10
    assert not isinstance(info.value, ConnectTimeoutError)
    assert "closed it before the SSH greeting" in info.value.message, info.value.message
    assert "within" not in info.value.message and "MaxStartups" in (info.value.remedy or "")

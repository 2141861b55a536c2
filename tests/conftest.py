"""Shared fixtures. `ssh_cluster` starts real OpenSSH servers on loopback (see tests/sshd_harness.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.sshd_harness import SshCluster, cluster_factory, sshd_available


@pytest.fixture
def ssh_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., SshCluster]]:
    """Factory: `cluster = ssh_cluster(3, names=[...], roles=[...], extra_sshd_config=..., sshd_prefix=[...])`.

    Every sshd it started is stopped, and its files removed, when the test ends.
    Skips the test when /usr/sbin/sshd is missing (install Debian's openssh-server).
    """
    if not sshd_available():
        pytest.skip("/usr/sbin/sshd not found: install openssh-server to run the real-sshd tests")
    make, teardown = cluster_factory(tmp_path_factory.mktemp("sshd"))
    try:
        yield make
    finally:
        teardown()

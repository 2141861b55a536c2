"""Shared fixtures. `ssh_cluster` starts real OpenSSH servers on loopback (see tests/sshd_harness.py).

End-to-end tests are marked `slow` here, in one place, so `scripts/test.sh --fast` (`-m "not slow"`)
is the inner loop while CI runs everything: a test is end-to-end when it uses the real-sshd harness
(the `ssh_cluster` fixture, directly or through another fixture, or the `ssh` marker), lives in a file
named `*e2e*`, or runs the demo or SGLang's own router.
"""

from __future__ import annotations

import logging
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


# besides every *e2e* file: the demo, and the simulator behind SGLang's own (Rust) router
END_TO_END_FILES = ("test_demo.py", "test_sglang_router.py")


def is_end_to_end(item: pytest.Item) -> bool:
    name = item.path.name
    return (
        "ssh_cluster" in getattr(item, "fixturenames", ())
        or item.get_closest_marker("ssh") is not None
        or "e2e" in name
        or name in END_TO_END_FILES
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if is_end_to_end(item) and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _router_logger_restored() -> Iterator[None]:
    """A test that runs `router serve` in-process (router/daemon/run.py, router/daemon/procs.py) gives the router's
    logger a JSON handler and turns propagation off, so a later test's caplog saw none of its records
    (a failure only in the full suite, depending on order): every test gets the logger back as it found it."""
    logger = logging.getLogger("infer_ctl.router")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved[0], saved[1], saved[2]

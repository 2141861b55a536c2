"""The per-node launch lock (launch/lock.py) through the real shell on this machine (local connector)."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from infer_ctl.errors import InferctlError
from infer_ctl.launch import lock
from infer_ctl.remote.local import LocalConnector

HOST = socket.gethostname()


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


BOOT_ID = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
PIDNS = os.readlink("/proc/self/ns/pid").partition("[")[2].rstrip("]")
OTHER_BOOT = "00000000-1111-2222-3333-444444444444"


def _line(
    pid: int, host: str = HOST, start: str = "-", boot: str | None = None, pidns: str | None = None
) -> str:
    """A lock line; without `boot`, as an older inferctl wrote it (no boot_id, no pidns)."""
    ids = "" if boot is None else f" boot_id={boot} pidns={pidns or PIDNS}"
    return f"pid={pid} host={host}{ids} user=ops since=2026-01-02T03:04:05Z start={start} cmd=launch"


def test_second_holder_fails_naming_the_first(tmp_path: Path) -> None:
    conn, path = LocalConnector("pf-01"), str(tmp_path / "etc" / "launch.lock")
    first = lock.me("launch")
    taken = lock.acquire(conn, path, first, sudo=False)
    assert taken.took_over is None and Path(path).read_text() == first + "\n"
    with pytest.raises(lock.LockHeld) as exc:
        lock.acquire(conn, path, _line(os.getpid() + 1, host="ctl-2"), sudo=False)
    assert exc.value.exit_code == 2
    assert exc.value.message.startswith(f"pf-01: another inferctl launch/stop is running here: {path} is held by "
                                        f"pid {os.getpid()} (")  # fmt: skip
    assert " since " in exc.value.message
    lock.release(conn, path, _line(12345), sudo=False)  # not ours: left alone
    assert Path(path).exists()
    lock.release(conn, path, first, sudo=False)
    assert not Path(path).exists()


def test_a_lock_from_a_dead_pid_on_this_host_is_taken_over(tmp_path: Path) -> None:
    conn, path = LocalConnector("pf-01"), tmp_path / "launch.lock"
    path.write_text(_line(_dead_pid()) + "\n")
    taken = lock.acquire(conn, str(path), lock.me("launch"), sudo=False)
    assert taken.took_over is not None and taken.took_over.host == HOST
    assert path.read_text().startswith(f"pid={os.getpid()} ")


def test_a_reused_pid_is_stale_too(tmp_path: Path) -> None:
    # the pid lives, but it is another process than the one that took the lock (its start time differs)
    holder = lock.Holder.parse(_line(os.getpid(), start="1"))
    assert lock.is_stale(holder)
    assert not lock.is_stale(lock.Holder.parse(lock.me("launch")))


def test_a_lock_from_another_host_is_never_broken(tmp_path: Path) -> None:
    conn, path = LocalConnector("pf-01"), tmp_path / "launch.lock"
    path.write_text(_line(_dead_pid(), host="bastion-7") + "\n")
    with pytest.raises(lock.LockHeld) as exc:
        lock.acquire(conn, str(path), lock.me("launch"), sudo=False)
    assert "(ops@bastion-7, inferctl launch) since 2026-01-02T03:04:05Z" in exc.value.message
    assert f"(it ran on bastion-7), remove {path} on pf-01" in (exc.value.remedy or "")


def test_the_lock_line_names_this_machine_boot_and_pid_namespace() -> None:
    holder = lock.Holder.parse(lock.me("stop"))
    assert (holder.pid, holder.host, holder.boot_id, holder.pidns, holder.cmd) == (
        os.getpid(),
        HOST,
        BOOT_ID,
        PIDNS,
        "stop",
    )
    assert not lock.is_stale(holder)


def test_a_dead_pid_of_this_boot_is_taken_over(tmp_path: Path) -> None:
    conn, path = LocalConnector("pf-01"), tmp_path / "launch.lock"
    path.write_text(_line(_dead_pid(), boot=BOOT_ID) + "\n")
    taken = lock.acquire(conn, str(path), lock.me("launch"), sudo=False)
    assert taken.took_over is not None and taken.took_over.boot_id == BOOT_ID
    assert path.read_text().startswith(f"pid={os.getpid()} ")


def test_a_lock_from_another_machine_with_this_hostname_is_never_broken(tmp_path: Path) -> None:
    # two controllers both named like this one (cloud images all boot as `ubuntu`): the pid is dead HERE,
    # which says nothing about the other machine, where that run may well be alive
    conn, path = LocalConnector("pf-01"), tmp_path / "launch.lock"
    line = _line(_dead_pid(), boot=OTHER_BOOT)
    path.write_text(line + "\n")
    assert not lock.is_stale(lock.Holder.parse(line))
    with pytest.raises(lock.LockHeld) as exc:
        lock.acquire(conn, str(path), lock.me("launch"), sudo=False)
    holder = lock.Holder.parse(line)
    assert (
        f"is held by pid {holder.pid} (ops@{HOST}, inferctl launch) since 2026-01-02T03:04:05Z"
        in exc.value.message
    )
    assert (f"(it ran on another machine also named {HOST}: boot_id {OTHER_BOOT}, this controller's is "
            f"{BOOT_ID}), remove {path} on pf-01") in (exc.value.remedy or "")  # fmt: skip
    assert path.read_text() == line + "\n"


def test_a_lock_from_another_pid_namespace_of_this_boot_is_never_broken(tmp_path: Path) -> None:
    # a controller in a container: same kernel (boot_id), its own pid numbers
    line = _line(_dead_pid(), boot=BOOT_ID, pidns="4026599999")
    assert not lock.is_stale(lock.Holder.parse(line))
    conn, path = LocalConnector("pf-01"), tmp_path / "launch.lock"
    path.write_text(line + "\n")
    with pytest.raises(lock.LockHeld) as exc:
        lock.acquire(conn, str(path), lock.me("launch"), sudo=False)
    assert "in another pid namespace (a container): pidns 4026599999" in (exc.value.remedy or "")


def test_waiting_on_a_foreign_lock_gets_it_once_released(tmp_path: Path) -> None:
    conn, path = LocalConnector("pf-01"), str(tmp_path / "launch.lock")
    foreign = _line(_dead_pid(), boot=OTHER_BOOT)
    lock.acquire(conn, path, foreign, sudo=False)
    with pytest.raises(lock.LockHeld) as exc:
        lock.acquire(conn, path, lock.me("launch"), sudo=False, wait_s=1, poll_s=0.2)
    assert exc.value.message.endswith("(waited 1 s)")
    threading.Timer(1.0, lock.release, (LocalConnector("pf-01"), path, foreign), {"sudo": False}).start()
    started = time.monotonic()
    taken = lock.acquire(conn, path, lock.me("launch"), sudo=False, wait_s=10, poll_s=0.2)
    assert taken.took_over is None and 0.9 < time.monotonic() - started < 5


def test_waiting_gets_the_lock_once_it_is_released(tmp_path: Path) -> None:
    conn, path = LocalConnector("pf-01"), str(tmp_path / "launch.lock")
    other = _line(os.getpid(), start=lock._proc_start(os.getpid()) or "-")
    lock.acquire(conn, path, other, sudo=False)
    threading.Timer(1.0, lock.release, (LocalConnector("pf-01"), path, other), {"sudo": False}).start()
    started = time.monotonic()
    lock.acquire(conn, path, lock.me("launch"), sudo=False, wait_s=10, poll_s=0.2)
    assert 0.9 < time.monotonic() - started < 5


def _take(path: Path, owner: str, outcomes: list[object]) -> None:
    try:
        outcomes.append(lock.acquire(LocalConnector("pf-01"), str(path), owner, sudo=False))
    except InferctlError as exc:
        outcomes.append(exc)


def test_two_take_overs_of_one_stale_lock_have_one_winner(tmp_path: Path) -> None:
    path = tmp_path / "launch.lock"
    results: list[str] = []
    for _ in range(5):
        path.write_text(_line(_dead_pid()) + "\n")
        outcomes: list[object] = []
        threads = [
            threading.Thread(target=_take, args=(path, f"pid={os.getpid()} host={HOST} run={k}", outcomes))
            for k in range(2)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        results.append("".join(sorted("T" if isinstance(o, lock.Taken) else "E" for o in outcomes)))
    assert set(results) == {"ET"}, results

"""fabric.link_flaps: the link-state lines of real captures (tests/fixtures/kernel-log, kernel-xid), the
aznhc rule (more than one down within fabric.flap_window_h fails), what earlier audits remember, and the
audit over real sshd (a stand-in journalctl printing the real capture restamped in -o short-iso)."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from infer_ctl.cli.main import main
from infer_ctl.core.fabric.link_flaps import LinkLog, judge_link_flaps
from infer_ctl.core.findings import Status
from infer_ctl.facts.link_flaps import event_time, parse_events, parse_flaps_output
from tests.fabric.cluster_setup import FabricNode, fabric_profile, free_port_range, setup_node

FIX = Path(__file__).parents[1] / "fixtures"
AZ = (FIX / "kernel-log" / "azurehpc-syslog-ib6-link-flap.txt").read_text()
GPUD = (FIX / "kernel-xid" / "gpud-pr1209-b200-fallen-off-bus-multiline-journalctl.txt").read_text()


def test_real_syslog_flap_capture() -> None:
    now = datetime(2026, 8, 17, 7, 0, tzinfo=UTC).timestamp()
    events = parse_events(AZ, now)
    assert [(e.link, e.state) for e in events] == [("ib6", "down")] * 6 + [("ib6", "up")] * 6
    assert events[0].at == datetime(2026, 8, 17, 6, 18, 1).timestamp()  # syslog stamps: the reading's year
    (f,) = judge_link_flaps("n1", LinkLog(events, window_h=6.0, read_at=now), None)
    # six "lost carrier" lines at two distinct instants: two downs within 6 h
    assert f.status is Status.FAIL and f.subject == "ib6" and f.message.startswith("ib6 is flapping: went down 2x")
    assert f.details["new_since_last_audit"] == 2 and f.code
    # a day later it is out of the window
    (ok,) = judge_link_flaps("n1", LinkLog(events, window_h=6.0, read_at=now + 86400), None)
    assert ok.status is Status.OK and ok.subject == "node"


def test_mlx5_port_events_and_stamp_formats() -> None:
    events = parse_events(GPUD, datetime(2026, 2, 14, 6, 0).timestamp())
    assert [(e.link, e.state) for e in events] == [("mlx5_5/1", "init"), ("mlx5_5/1", "up")]
    assert not [f for f in judge_link_flaps("n1", LinkLog(events, read_at=events[0].at), None) if f.status is not Status.OK]
    # journalctl -o short-iso, and mlx5e's netdev lines
    iso = "2026-12-01T10:00:00+0000 pf-01 kernel: mlx5_core 0000:3b:00.0 ens1f0np0: Link down"
    (e,) = parse_events(iso, time.time())
    assert (e.link, e.state, e.at) == ("ens1f0np0", "down", datetime(2026, 12, 1, 10, tzinfo=UTC).timestamp())
    assert event_time("[  12.5] mlx5_core: Link down", 0, boot_time=1000.0) == 1012.5
    # a syslog stamp later in the year than the reading is last year's
    assert datetime.fromtimestamp(event_time("Dec 31 23:00:00 h x", datetime(2027, 1, 1, 1).timestamp()) or 0).year == 2026


def test_memory_keeps_flaps_the_journal_rotated_away() -> None:
    t0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC).timestamp()
    one = parse_events("2026-12-01T08:00:00+0000 n systemd-networkd[1]: ib0: lost carrier", t0)
    (first,) = judge_link_flaps("n1", LinkLog(one, read_at=t0 + 60), None)
    assert first.status is Status.WARN and first.details["memory"] == {"downs": [t0]}
    # next audit: the journal holds only a new down; the earlier one comes from memory: flapping
    two = parse_events("2026-12-01T09:00:00+0000 n systemd-networkd[1]: ib0: lost carrier", t0)
    (second,) = judge_link_flaps("n1", LinkLog(two, read_at=t0 + 3660), {"ib0": first.details["memory"]})
    assert second.status is Status.FAIL and second.details["downs_in_window"] == 2
    assert second.details["new_since_last_audit"] == 1
    # unreadable journal: skipped with what to do, never a failure
    (skip,) = judge_link_flaps("n1", parse_flaps_output("1700000000\nUNREADABLE dmesg: read kernel buffer failed: "
                                                        "Operation not permitted\n", 6.0), None)
    assert skip.status is Status.SKIP and "Operation not permitted" in skip.message


def _journal(lines: list[tuple[float, str]]) -> str:
    return "".join(datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S+0000") + f" pf-01 {rest}\n"
                   for t, rest in lines)


@pytest.mark.ssh
def test_audit_remembers_flaps_between_runs(ssh_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    cluster = ssh_cluster(names=["pf-01", "dc-01"], roles=[["prefill"], ["decode"]])
    sysfs = tmp_path / "sysfs"
    for n in ("pf-01", "dc-01"):
        setup_node(cluster, sysfs, n, FabricNode(ipv4=cluster.node(n).host))
    monkeypatch.setenv("INFERCTL_SYSFS_ROOT", str(sysfs / "{node}"))
    profile = fabric_profile(cluster, tmp_path / "p.yaml", free_port_range())
    log = cluster.bin_dir("pf-01") / "journal.txt"
    cluster.add_executable("pf-01", "journalctl", f'printf "%s\\n" "$*" > {log}.argv; cat {log}\n')
    hist = tmp_path / "audit.jsonl"
    # the real capture's systemd-networkd lines, restamped as `journalctl -o short-iso` prints them (mutated)
    now = time.time()
    lines = [ln.split(" ", 4)[4] for ln in AZ.splitlines() if "systemd-networkd" in ln]
    log.write_text(_journal([(now - 3600, lines[0])]))  # one lost carrier an hour ago

    def audit() -> dict:
        capsys.readouterr()
        main(["audit", "-p", str(profile), "--json", "--only", "fabric", "--history", str(hist)])
        doc = json.loads(capsys.readouterr().out)
        return {(f["node"], f["subject"]): f for f in doc["findings"] if f["check"] == "fabric.link_flaps"}

    first = audit()
    assert first[("pf-01", "ib6")]["status"] == "warn" and first[("dc-01", "node")]["status"] in ("ok", "skip")
    assert "_TRANSPORT=kernel + SYSLOG_IDENTIFIER=systemd-networkd" in (log.parent / "journal.txt.argv").read_text()
    log.write_text(_journal([(now - 60, lines[1])]))  # the journal rotated; a new flap a minute ago
    second = audit()[("pf-01", "ib6")]
    assert second["status"] == "fail" and second["details"]["downs_in_window"] == 2
    assert second["details"]["new_since_last_audit"] == 1
    log.write_text("")  # nothing new: the two downs are still within the window
    third = audit()[("pf-01", "ib6")]
    assert third["status"] == "fail" and third["details"]["new_since_last_audit"] == 0
    record = json.loads(hist.read_text().splitlines()[-1])
    assert len(record["memory"]["fabric.link_flaps"]["pf-01"]["ib6"]["downs"]) == 2

"""Judging pair tests from real rc_pingpong / perftest outputs (tests/fixtures/rdma) into findings.

As in the check, both ends' text is parsed first (facts.rdma_pingpong), then judged (core.fabric.judge)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infer_ctl.core.fabric.judge import PairRun, Thresholds, judge_pair, pair_matrix
from infer_ctl.core.fabric.pairs import Endpoint, PairTest
from infer_ctl.core.findings import Finding, Status
from infer_ctl.facts.rdma_pingpong import parse_pair_output

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "rdma"
TEST = PairTest(Endpoint("pf-01", "10.0.0.11", "mlx5_0", 3), Endpoint("dc-01", "10.0.0.21", "mlx5_0", 3), 18515, 0)


def _text(tool: str, name: str) -> str:
    return (FIX / tool / name).read_text()


def _run(client: str, server: str, *, tool: str = "ibv_rc_pingpong", cx: int | None = 0, sx: int | None = 0,
         ready: bool = True, **kw: object) -> PairRun:
    return PairRun(TEST, tool, ready, sx, server, cx, client, **kw)  # type: ignore[arg-type]


def _judge(run: PairRun, th: Thresholds) -> Finding:
    return judge_pair(run, parse_pair_output(run.tool, run.client_text), parse_pair_output(run.tool, run.server_text), th)


OK_CLIENT = _text("ibv_rc_pingpong", "magnate3-cx6dx-client-success-gid3.txt")
OK_SERVER = _text("ibv_rc_pingpong", "magnate3-cx6dx-server-success-gid3.txt")

CASES = [
    ("6.78us under an 8us limit", _run(OK_CLIENT, OK_SERVER), Thresholds(8.0), Status.OK, "round trip 6.78 us"),
    ("6.78us over the 6us default", _run(OK_CLIENT, OK_SERVER), Thresholds(), Status.WARN, "limit 6 us"),
    ("E810 14.69us is over twice 6us", _run(_text("ibv_rc_pingpong", "magnate3-irdma-e810-client-success.txt"),
                                            _text("ibv_rc_pingpong", "magnate3-irdma-e810-server-success.txt")),
     Thresholds(), Status.FAIL, "14.69"),
    ("transport retry exceeded", _run(_text("ibv_rc_pingpong", "magnate3-cx6dx-client-transport-retry-exceeded.txt"), "",
                                      cx=1, sx=None), Thresholds(), Status.FAIL, "transport retry counter exceeded"),
    ("server RTR failure", _run("", _text("ibv_rc_pingpong", "magnate3-irdma-server-failed-modify-qp-rtr.txt"), cx=1, sx=1),
     Thresholds(), Status.FAIL, "Failed to modify QP to RTR"),
    ("server never listened", _run("", _text("ibv_rc_pingpong", "REAL-HERE-debian12-no-rdma-device.txt"), ready=False, sx=1),
     Thresholds(), Status.FAIL, "never listened"),
    ("client hung", _run("", "", cx=None, sx=None, client_timed_out=True), Thresholds(), Status.FAIL, "timed out (client)"),
    ("node lost", _run("", "", error="dc-01: connection lost"), Thresholds(), Status.UNKNOWN, "could not run"),
    ("ib_write_lat 2x1.78us", _run(_text("perftest", "FROM-FORMAT-ib_write_lat-client-roce-gid3.txt"), "", tool="ib_write_lat"),
     Thresholds(), Status.OK, "round trip 3.56 us"),
    ("ib_write_lat no device", _run(_text("perftest", "REAL-HERE-ib_write_lat-no-device.txt"), "", tool="ib_write_lat", cx=1),
     Thresholds(), Status.FAIL, "Did not detect devices"),
    ("ib_write_bw 111.7 of 200G", _run(_text("perftest", "sparkvllm-ib_write_bw-client-dgx-spark-cx7-roce-4qp-force-link-ib.txt"), "",
                                       tool="ib_write_bw"), Thresholds(link_gbps=200), Status.WARN, "111.7 Gb/s"),
    ("ib_write_bw 111.7 of 100G", _run(_text("perftest", "sparkvllm-ib_write_bw-client-dgx-spark-cx7-roce-4qp-force-link-ib.txt"), "",
                                       tool="ib_write_bw"), Thresholds(link_gbps=100), Status.OK, "target 80"),
]


@pytest.mark.parametrize(("name", "run", "th", "status", "text"), CASES, ids=[c[0] for c in CASES])
def test_judge_pair(name: str, run: PairRun, th: Thresholds, status: Status, text: str) -> None:
    f = _judge(run, th)
    assert f.status is status, f.message
    assert text in f.message
    assert f.details["server"] == "pf-01" and f.details["client"] == "dc-01"
    assert "pf-01" in f.subject and "dc-01" in f.subject
    if status is not Status.OK:
        assert f.remedy


def test_retry_exceeded_names_the_likely_causes() -> None:
    f = _judge(CASES[3][1], Thresholds())
    assert f.remedy and all(word in f.remedy for word in ("GID index", "PFC", "MTU"))


def test_client_hang_before_exchange_points_at_firewall() -> None:
    f = _judge(CASES[6][1], Thresholds())
    assert f.remedy and "TCP port 18515" in f.remedy and "firewall" in f.remedy


def test_matrix_takes_worst_status_and_rtt() -> None:
    good, slow = _judge(_run(OK_CLIENT, OK_SERVER), Thresholds(8.0)), _judge(_run(OK_CLIENT, OK_SERVER), Thresholds())
    cell = pair_matrix([good, slow])[("pf-01", "dc-01")]
    assert cell.status is Status.WARN and cell.text == "6.78 us"


def test_perftest_failed_status_12_gets_the_retry_exceeded_remedy() -> None:
    """perftest before 2025-07 prints only the number: `Failed status 12` is IBV_WC_RETRY_EXC_ERR."""
    run = _run(_text("perftest", "FROM-FORMAT-ib_write_bw-client-failed-status-12-perftest-4.5.txt"), "",
               tool="ib_write_bw", cx=1, sx=None)
    f = _judge(run, Thresholds(link_gbps=400))
    assert f.status is Status.FAIL and "Failed status 12" in f.message
    assert f.remedy and "transport retry counter exceeded" in f.remedy and "GID index" in f.remedy and "PFC" in f.remedy
    # the newer wording carries the same number
    newer = _run(" Completion with error at client\n Failed status-transport retry counter exceeded (12): wr_id 0 "
                 "syndrom 0x81\n scnt=128, ccnt=0\n", "", tool="ib_write_bw", cx=1, sx=None)
    assert "transport retry counter exceeded" in (_judge(newer, Thresholds()).remedy or "")
    rnr = _run(" Completion with error at client\n Failed status 13: wr_id 0 syndrom 0x88\n", "", tool="ib_write_bw", cx=1)
    assert "RNR" in (_judge(rnr, Thresholds()).remedy or "")


@pytest.mark.parametrize(("tool", "client"), [
    ("ibv_rc_pingpong", "Name or service not known for pf-01.ic:18515\n"),  # rc_pingpong's pp_client_exch_dest
    ("ib_write_lat", _text("perftest", "FROM-FORMAT-ib_write_lat-client-name-not-known.txt")),
])
def test_a_name_the_client_cannot_resolve_is_not_blamed_on_the_fabric(tool: str, client: str) -> None:
    alias = PairTest(Endpoint("pf-01", "pf-01.ic", "mlx5_0", 3), Endpoint("dc-01", "10.0.0.21", "mlx5_0", 3), 18515, 0)
    f = _judge(PairRun(alias, tool, True, None, "", 1, client, server_address_source="profile"), Thresholds())
    assert f.status is Status.FAIL and f.remedy
    assert "dc-01 cannot resolve 'pf-01.ic'" in f.remedy and "ssh/config aliases" in f.remedy
    assert "PFC" not in f.remedy and "MTU" not in f.remedy
    assert f.details["server_address"] == "pf-01.ic" and f.details["server_address_source"] == "profile"


def test_a_tcp_connect_failure_names_the_address_and_port() -> None:
    f = _judge(_run("Couldn't connect to 10.0.0.11:18515\n", "", cx=1, sx=None), Thresholds())
    assert f.remedy and "could not open TCP 10.0.0.11:18515" in f.remedy and "firewall" in f.remedy
    assert "PFC" not in f.remedy
    # RTR failures also say "Couldn't connect" (to the remote QP): still the QP remedy
    rtr = _judge(_run("Failed to modify QP to RTR\nCouldn't connect to remote QP\n", "", cx=1, sx=None), Thresholds())
    assert rtr.remedy and "GID index" in rtr.remedy

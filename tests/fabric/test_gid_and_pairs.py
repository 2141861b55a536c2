"""GID scoring (perftest's get_best_gid_index) and the pair scheduler: which pairs, order, rounds, ports."""

from __future__ import annotations

from pathlib import Path

import pytest

from infer_ctl.core.fabric.facts import GidEntry
from infer_ctl.core.fabric.gid import choose_gid, score_gid
from infer_ctl.core.fabric.pairs import (
    Endpoint,
    PairFlags,
    perftest_argv,
    rc_pingpong_argv,
    rounds,
    schedule,
    select_pairs,
)
from infer_ctl.errors import UsageError
from infer_ctl.facts.ibv_devinfo import parse_ibv_devinfo
from infer_ctl.facts.show_gids import parse_show_gids

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "rdma"


def _devinfo_gids(name: str) -> list[GidEntry]:
    dev = parse_ibv_devinfo((FIX / "ibv_devinfo" / name).read_text())[0]
    return dev.ports[1].gids


@pytest.mark.parametrize(
    ("fixture", "index", "family"),
    [
        ("magnate3-cx6dx-mt4125-roce-v.txt", 3, "ipv4"),  # mlx5 layout: IPv4 RoCE v2 at 3
        ("magnate3-intel-e810-irdma-roce-v.txt", 1, "ipv4"),  # E810: IPv4 RoCE v2 at 1, not 3
    ],
)
def test_choice_on_real_gid_tables(fixture: str, index: int, family: str) -> None:
    choice = choose_gid(_devinfo_gids(fixture))
    assert choice is not None and (choice.index, choice.family, choice.roce_version) == (index, family, 2)


def test_choice_on_show_gids_rows() -> None:
    rows = parse_show_gids((FIX / "show_gids" / "magnate3-8dev-roce-v1v2-and-ib.txt").read_text())
    by_dev: dict[str, list[GidEntry]] = {}
    for r in rows:
        by_dev.setdefault(r.device, []).append(r.entry)
    chosen = {d: c.index for d, gids in by_dev.items() if (c := choose_gid(gids))}
    # IPv4-addressed ports get their v2 IPv4 GID; link-local-only ports fall back to the v2 link-local
    assert chosen["mlx5_2"] == 3 and chosen["mlx5_3"] == 3
    assert chosen["mlx5_0"] == 1 and chosen["mlx5_5"] == 0


def test_scores_follow_perftest_weights() -> None:
    v4v2 = GidEntry(3, "::ffff:10.0.0.1", "RoCE v2")
    v4v1 = GidEntry(2, "0000:0000:0000:0000:0000:ffff:0a00:0001", "IB/RoCE v1")
    ll2 = GidEntry(1, "fe80::1", "RoCE v2")
    g6 = GidEntry(5, "2001:db8::1", "RoCE v2")
    assert [score_gid(g) for g in (v4v2, v4v1, ll2, g6)] == [112, 111, 2, 12]
    assert score_gid(g6, prefer="ipv6") == 112
    assert score_gid(GidEntry(9, "::", "RoCE v2")) is None
    # a global IPv6 GID beats link-local; with IPv6 preferred it beats IPv4
    assert choose_gid([ll2, g6]).index == 5  # type: ignore[union-attr]
    assert choose_gid([v4v2, g6], prefer="ipv6").index == 5  # type: ignore[union-attr]
    # ties keep the lowest index
    assert choose_gid([GidEntry(7, "::ffff:10.0.0.2", "RoCE v2"), v4v2]).index == 3  # type: ignore[union-attr]
    assert choose_gid([]) is None


def test_pair_selection_modes() -> None:
    pf, dc, all_ = ["pf-01", "pf-02"], ["dc-01", "dc-02", "dc-03"], ["pf-01", "pf-02", "dc-01", "dc-02", "dc-03"]
    assert select_pairs("prefill-decode", pf, dc, all_) == [
        ("pf-01", "dc-01"), ("pf-01", "dc-02"), ("pf-01", "dc-03"), ("pf-02", "dc-01"), ("pf-02", "dc-02"), ("pf-02", "dc-03")]
    assert len(select_pairs("mesh", pf, dc, all_)) == 10
    assert select_pairs("explicit", pf, dc, all_, [("pf-02", "dc-03"), ("gone", "dc-01")]) == [("pf-02", "dc-03")]
    with pytest.raises(UsageError):
        select_pairs("explicit", pf, dc, all_, [("pf-01", "pf-01")])
    with pytest.raises(UsageError):
        select_pairs("ring", pf, dc, all_)


def _eps(node: str, n: int = 1) -> list[Endpoint]:
    return [Endpoint(node, f"10.0.0.{len(node)}", f"mlx5_{i}", 3) for i in range(n)]


def test_schedule_rounds_never_share_an_hca_and_ports_are_unique() -> None:
    pf, dc = [f"pf-0{i}" for i in range(1, 3)], [f"dc-0{i}" for i in range(1, 7)]
    eps = {n: _eps(n, 2) for n in pf + dc}
    tests = schedule(select_pairs("prefill-decode", pf, dc, pf + dc), eps, 20000)
    assert len(tests) == 2 * 6 * 2  # rail-aligned: mlx5_0<->mlx5_0, mlx5_1<->mlx5_1
    assert sorted(t.tcp_port for t in tests) == list(range(20000, 20024))
    by_round = rounds(tests)
    assert len(by_round) == 6  # the lower bound: each prefill HCA meets 6 decode HCAs
    for r in by_round:
        hcas = [(e.node, e.device) for t in r for e in (t.server, t.client)]
        assert len(hcas) == len(set(hcas))
    assert all(t.server.device == t.client.device for t in tests)
    assert {t.server.node for t in tests} == set(pf)


def test_schedule_skips_nodes_without_endpoints_and_checks_port_range() -> None:
    tests = schedule([("a", "b"), ("a", "c")], {"a": _eps("a"), "b": _eps("b")}, 18515)
    assert [(t.server.node, t.client.node, t.tcp_port) for t in tests] == [("a", "b", 18515)]
    with pytest.raises(UsageError, match="65535"):
        schedule([("a", "b")], {"a": _eps("a", 3), "b": _eps("b", 3)}, 65534)


def test_both_sides_get_the_same_flags() -> None:
    flags = PairFlags(size=4096, iters=500, mtu=4096)
    s, c = Endpoint("pf", "10.0.0.1", "mlx5_0", 3), Endpoint("dc", "10.0.0.2", "mlx5_2", 1)
    server = rc_pingpong_argv(s, flags, 19000)
    client = rc_pingpong_argv(c, flags, 19000, server_host="10.0.0.1")
    assert server == ["ibv_rc_pingpong", "-d", "mlx5_0", "-i", "1", "-p", "19000", "-s", "4096", "-n", "500", "-m", "4096", "-g", "3"]
    assert client[-1] == "10.0.0.1" and client[client.index("-g") + 1] == "1"
    strip = {"-d", "-g"}
    def shared(argv: list[str]) -> list[str]:
        return [a for i, a in enumerate(argv[:-1] if argv is client else argv) if a not in strip and argv[i - 1] not in strip]
    assert shared(server) == shared(client)
    ib = Endpoint("pf", "h", "mlx5_0", None)
    assert "-g" not in rc_pingpong_argv(ib, flags, 1) and "-x" not in perftest_argv("ib_write_lat", ib, flags, 1)
    assert perftest_argv("ib_write_bw", s, flags, 5, "h")[-1] == "h"
    assert "--report_gbits" in perftest_argv("ib_write_bw", s, flags, 5)

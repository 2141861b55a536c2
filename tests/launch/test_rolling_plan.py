"""Which servers `launch` restarts together (launch/rolling.py): pure, no hosts."""

from __future__ import annotations

from typing import Any

import pytest

from infer_ctl.core.sglang import instances
from infer_ctl.launch import rolling
from infer_ctl.profile.load import validate_profile_data


def _profile(roles: list[str], gpus: int = 0, **sglang: Any) -> Any:
    nodes = []
    for k, role in enumerate(roles):
        node: dict[str, Any] = {"name": f"{role[:2]}-{k:02d}", "host": f"10.0.0.{k + 10}", "roles": [role]}
        if gpus:
            node["gpus"] = gpus
        nodes.append(node)
    return validate_profile_data(
        {"name": "t", "nodes": nodes, "models": {"target": {"path": "/m", "tp": 8}}, "sglang": sglang}
    )


def _names(steps: list[rolling.Step]) -> list[list[str]]:
    return [[i.name for i in s.instances] for s in steps]


def test_two_prefills_two_decodes_restart_one_at_a_time_prefills_first() -> None:
    every = instances(_profile(["decode", "prefill", "prefill", "decode"]))
    steps = rolling.plan(every, every)
    assert _names(steps) == [["pr-01-prefill"], ["pr-02-prefill"], ["de-00-decode"], ["de-03-decode"]]
    assert [s.role for s in steps] == ["prefill", "prefill", "decode", "decode"]
    assert not any(s.alone for s in steps)


@pytest.mark.parametrize(("n", "expected"), [
    (1, [["pr-00-prefill"], ["pr-01-prefill"], ["pr-02-prefill"]]),
    (2, [["pr-00-prefill", "pr-01-prefill"], ["pr-02-prefill"]]),
    (9, [["pr-00-prefill", "pr-01-prefill"], ["pr-02-prefill"]]),  # capped: one keeps serving
])  # fmt: skip
def test_max_unavailable_is_capped_so_one_server_of_the_role_keeps_serving(
    n: int, expected: list[list[str]]
) -> None:
    every = instances(_profile(["prefill", "prefill", "prefill", "decode"]))
    prefills = [i for i in every if i.role == "prefill"]
    assert _names(rolling.plan(prefills, every, max_unavailable=n)) == expected


def test_the_cap_counts_the_profiles_servers_not_the_selection() -> None:
    every = instances(_profile(["prefill", "prefill", "prefill", "decode"]))
    two = [i for i in every if i.name in ("pr-00-prefill", "pr-01-prefill")]
    # the third prefill, not selected, keeps serving: both selected may go together
    assert _names(rolling.plan(two, every, max_unavailable=2)) == [["pr-00-prefill", "pr-01-prefill"]]


def test_a_role_with_one_server_is_planned_alone() -> None:
    every = instances(_profile(["prefill", "decode", "decode"]))
    steps = rolling.plan(every, every, max_unavailable=3)
    assert [(s.role, s.alone) for s in steps] == [("prefill", True), ("decode", False), ("decode", False)]


def test_a_server_over_two_nodes_is_one_step_with_every_rank() -> None:
    profile = _profile(["prefill", "decode", "decode", "decode", "decode"], gpus=8,
                       prefill={"tp": 8}, decode={"tp": 16})  # fmt: skip
    every = instances(profile)
    steps = rolling.plan(every, every)
    assert _names(steps) == [["pr-00-prefill"], ["de-01-decode", "de-02-decode"], ["de-03-decode", "de-04-decode"]]
    assert [[i.node_rank for i in s.instances] for s in steps] == [[0], [0, 1], [0, 1]]
    assert [i.name for i in steps[1].leaders] == ["de-01-decode"]
    # a selection naming one rank widens to the whole server
    rank1 = [i for i in every if i.name == "de-04-decode"]
    assert [i.name for i in rolling.whole_servers(rank1, every)] == ["de-03-decode", "de-04-decode"]
    assert _names(rolling.at_once(rolling.whole_servers(rank1, every))) == [["de-03-decode", "de-04-decode"]]


def test_max_unavailable_below_one_is_refused() -> None:
    every = instances(_profile(["prefill", "decode"]))
    with pytest.raises(ValueError, match="at least 1"):
        rolling.plan(every, every, max_unavailable=0)

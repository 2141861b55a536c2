"""What several router replicas share (pure parts and the profile): the named-prefix document a replica
writes and another loads, placement by rendezvous hash, and the profile's `router.replicas` /
`router.state_store` rules. The replicas themselves over a real Redis: tests/router/scaleout/test_replicas.py."""

from __future__ import annotations

import pytest

from infer_ctl.core.routing.policy import WorkerView
from infer_ctl.core.routing.prefixes import PrefixRegistry, PrefixState
from infer_ctl.errors import InferctlError
from infer_ctl.profile.load import parse_profile_text
from infer_ctl.router.config import from_profile
from infer_ctl.router.scaleout.state_sync import redact
from tests.router.conftest import new_prefix_registry

W = [WorkerView(f"http://p{i}:1") for i in range(4)]


def warm_all(reg: PrefixRegistry, now: float, workers: list[WorkerView] = W) -> None:
    for a in reg.plan_warmups(workers, now):
        reg.warm_done(a, True, now)


def test_a_loaded_document_is_the_exported_state_with_times_moved_to_the_other_clock() -> None:
    a = new_prefix_registry()
    a.register("sys", "v1 text", now=100.0, ttl_s=50.0, replicas=2, pin=True, fmt="chat")
    a.register("sys", "v2 text", now=110.0)  # supersedes v1; keeps nothing (register takes what it is given)
    a.expire("sys", now=120.0)
    doc = a.export_name("sys", wall_offset=1_000_000.0)
    assert [v["registered_at"] for v in doc["versions"]] == [1_000_100.0, 1_000_110.0]
    b = new_prefix_registry()
    b.load_name("sys", doc, wall_offset=999_000.0)  # b's monotonic clock is 1000 s ahead of a's
    got = [(r.version, r.text, r.state, r.registered_at, r.ended_at, r.ttl_s, r.replicas, r.pin, r.fmt)
           for r in b.records()]
    assert got == [(1, "v1 text", PrefixState.SUPERSEDED, 1100.0, 1110.0, 50.0, 2, True, "chat"),
                   (2, "v2 text", PrefixState.EXPIRED, 1110.0, 1120.0, None, 1, False, "text")]
    assert b.export_name("sys", 999_000.0) == doc


def test_ttl_expires_at_the_same_absolute_time_on_both_replicas() -> None:
    a, b = new_prefix_registry(), new_prefix_registry()
    a.register("p", "text", now=5.0, ttl_s=10.0)
    b.load_name("p", a.export_name("p", 1000.0), 1000.0 - 300.0)  # b's clock reads 300 s more
    assert [r.name for r in a.tick(14.9)] == [] and [r.name for r in b.tick(314.9)] == []
    assert [r.name for r in a.tick(15.0)] == ["p"] and [r.name for r in b.tick(315.0)] == ["p"]


def test_loading_keeps_placements_and_statistics_and_a_warm_request_rewarms() -> None:
    reg = new_prefix_registry()
    reg.register("p", "text", now=0.0, replicas=2)
    warm_all(reg, 0.0)
    rec = reg.active("p")
    assert rec is not None and len(rec.warm_replicas()) == 2
    rec.stats.requests = 7
    other = new_prefix_registry()
    other.load_name("p", reg.export_name("p", 0.0), 0.0)
    other.request_warm("p", now=3.0)  # the operator's `warm` on another replica
    reg.load_name("p", other.export_name("p", 0.0), 0.0)
    same = reg.active("p")
    assert same is rec and rec.stats.requests == 7 and rec.registered_at == 3.0
    assert len(reg.plan_warmups(W, 4.0)) == 2  # both replicas warmed again
    assert reg.plan_warmups(W, 4.0) == []


def test_a_tombstone_removes_the_name_and_its_remembered_settings() -> None:
    reg = new_prefix_registry(forget_after_s=1.0)
    reg.register("p", "text", now=0.0, replicas=3)
    reg.expire("p", 0.0)
    reg.tick(5.0)  # forgotten, its settings remembered for the next `add`
    assert reg.records() == [] and reg.settings("p") is not None
    doc = reg.export_name("p", 0.0)
    assert doc["versions"] == [] and doc["settings"] == [None, 3, False, "text", None]
    other = new_prefix_registry()
    other.load_name("p", doc, 0.0)
    assert other.settings("p") == (None, 3, False, "text", None)
    reg.register("p", "text again", now=6.0)
    reg.remove("p")
    tomb = reg.export_name("p", 0.0)
    assert tomb == {"name": "p", "removed": True}
    other.load_name("p", tomb, 0.0)
    assert other.records() == [] and other.settings("p") is None


@pytest.mark.parametrize("doc", [
    {"versions": "x"},
    {"versions": [{"version": 1, "text": "t"}]},
    {"versions": [{"version": 1, "text": "t", "registered_at": 0, "replicas": 1, "pin": False, "fmt": "text",
                   "state": "bogus"}]},
    {"versions": [], "settings": ["x", 1, False, "text"]},
])
def test_a_malformed_document_changes_nothing(doc: dict) -> None:
    reg = new_prefix_registry()
    reg.register("p", "text", now=0.0)
    before = reg.export_name("p", 0.0)
    with pytest.raises(ValueError, match="prefix 'p'"):
        reg.load_name("p", doc, 0.0)
    assert reg.export_name("p", 0.0) == before


def test_shared_placement_is_the_same_whatever_each_replica_sees_of_load_and_order() -> None:
    """Two replicas see different local load and learn the prefixes in different orders: placed by
    rendezvous hash, every prefix lands on the same workers on both. By load (one router), they differ."""
    names = [f"p{i}" for i in range(5)]

    def placements(shared: bool, loads: list[int], order: list[str]) -> dict[str, set[str]]:
        reg = new_prefix_registry(shared_placement=shared)
        for n in order:
            reg.register(n, f"text of {n}", now=0.0, replicas=2)
        views = [WorkerView(w.url, inflight=load) for w, load in zip(W, loads, strict=True)]
        warm_all(reg, 0.0, views)
        return {r.name: set(r.warm_replicas()) for r in reg.records()}

    a = placements(True, [0, 5, 0, 9], names)
    b = placements(True, [7, 0, 3, 0], list(reversed(names)))
    assert a == b
    assert placements(False, [0, 5, 0, 9], names) != placements(False, [7, 0, 3, 0], list(reversed(names)))


PROFILE = """
name: fleet-a
nodes:
  - {name: p, host: 127.0.0.11, connection: local, roles: [prefill], gpus: 1}
  - {name: d, host: 127.0.0.21, connection: local, roles: [decode], gpus: 1}
router:
  listen: 127.0.0.1:8001
"""


def profile(extra: str) -> object:
    return parse_profile_text(PROFILE + "".join(f"  {line}\n" for line in extra.strip().splitlines()), "p.yaml")


@pytest.mark.parametrize(("extra", "message"), [
    ('replicas: ["127.0.0.1:8001", "127.0.0.1:8002"]', "router.state_store is required"),
    ('replicas: ["127.0.0.1:8001", "127.0.0.1:8001"]\nstate_store: redis://h:6379/0', "listed twice"),
    ('replicas: ["127.0.0.1:8001", "127.0.0.1:70000"]\nstate_store: redis://h:6379/0', "above 65535"),
    ('replicas: ["127.0.0.1"]', "replicas"),
    ("state_store: redis://:secret@h:6379/0", "no password in the URL"),
    ("state_store: http://h:6379", "is not redis://"),
    ("state_store: redis://h:6379/zero", "database number"),
    ("state_store: redis://:6379/0", "names no host"),
    ("state_store_password_env: 'no-such var'", "state_store_password_env"),
])
def test_profile_refuses_bad_replica_settings_naming_the_field(extra: str, message: str) -> None:
    with pytest.raises(InferctlError) as exc:
        profile(extra)
    assert message in str(exc.value) and "router" in str(exc.value)


def test_profile_replicas_become_the_router_config() -> None:
    prof = profile('replicas: ["127.0.0.1:8001", "127.0.0.1:8002"]\nstate_store: rediss://ops@h:6380/2\n'
                   "state_store_password_env: STORE_PW")
    cfg = from_profile(prof, listen="127.0.0.1:8002", workers=[], env={"STORE_PW": "s3"})
    assert (cfg.settings.replicas, cfg.settings.state_store, cfg.state_store_password, cfg.state_namespace) == (
        ["127.0.0.1:8001", "127.0.0.1:8002"], "rediss://ops@h:6380/2", "s3", "fleet-a")
    with pytest.raises(InferctlError, match=r"router\.replicas does not list"):
        from_profile(prof, listen="127.0.0.1:8003", workers=[], env={"STORE_PW": "s3"})
    with pytest.raises(InferctlError, match="STORE_PW, which is not set"):
        from_profile(prof, listen="127.0.0.1:8001", workers=[], env={})


def test_the_store_url_is_shown_without_credentials() -> None:
    assert redact("rediss://ops:pw@store.internal:6380/2") == "rediss://store.internal:6380/2"
    assert redact("redis://[::1]:6379/0") == "redis://[::1]:6379/0"

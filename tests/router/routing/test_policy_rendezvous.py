"""Rendezvous placement of misses (core/routing/policy.py, `miss_placement`): a prompt no worker holds
goes to its home, the highest-weight worker for a stable key of its first characters, among the workers
within the load slack of the least loaded. Pure: the policy over worker snapshots and an empty index."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from infer_ctl.core.routing.policy import (
    PLACEMENT_KEY_CHARS,
    PolicyConfig,
    WorkerView,
    choose_prefill,
    placement_key,
    rendezvous_rank,
)
from infer_ctl.core.routing.units import ScoreInputs
from infer_ctl.errors import ProfileError, UsageError
from infer_ctl.profile import parse_profile_text
from infer_ctl.router.config import RouterConfig, from_profile, policy_config, router_settings
from tests.router.conftest import new_prefix_index
from tests.unit.test_profile import BASE

ROOT = Path(__file__).resolve().parents[3]
URLS = [f"http://10.0.0.{i}:30000" for i in range(1, 5)]
CFG = policy_config(router_settings(miss_placement="rendezvous"))
P2C = policy_config(router_settings())  # the default


def rendezvous_order(key: bytes, urls: list[str]) -> list[str]:
    """The key's order of the workers, by the weight the policy ranks them with (highest first)."""
    return sorted(urls, key=lambda u: rendezvous_rank(key, u), reverse=True)


def texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [f"tenant {i} system prompt " + " ".join(rng.choice(["alpha", "beta", "gamma", "delta"]) for _ in range(300))
            for i in range(n)]


def place(text: str, rng: random.Random, loads: dict[str, int] | None = None, urls: list[str] = URLS,
          cfg: PolicyConfig = CFG) -> tuple[str, str]:
    ix = new_prefix_index(block_chars=64)
    views = [WorkerView(u, inflight=(loads or {}).get(u, 0)) for u in urls]
    c = choose_prefill(hashes=ix.hashes(text), text_chars=len(text), workers=views, index=ix, now=0.0, cfg=cfg,
                       rng=rng, key=placement_key(text))
    return c.url, c.reason


def test_same_key_same_worker_for_independent_rngs() -> None:
    ts = texts(40)
    a = [place(t, random.Random(1)) for t in ts]
    b = [place(t, random.Random(2)) for t in ts]
    assert a == b and {r for _, r in a} == {"home"}
    # only the first PLACEMENT_KEY_CHARS count: a different tail (the next turn, another question) keeps the home
    assert [place(t + " and then something else entirely", random.Random(3))[0] for t in ts] == [u for u, _ in a]
    # the earlier rule places the same prompts on a random pair's less-loaded worker: the two disagree
    old_a = [place(t, random.Random(1), cfg=P2C)[0] for t in ts]
    old_b = [place(t, random.Random(2), cfg=P2C)[0] for t in ts]
    assert old_a != old_b


def test_key_is_stable_across_processes_with_other_hash_seeds() -> None:
    ts = texts(12, seed=5)
    here = [place(t, random.Random(0))[0] for t in ts]
    code = ("import json, random, sys; sys.path.insert(0, sys.argv[1]); "
            "from tests.router.routing.test_policy_rendezvous import place, texts; "
            "print(json.dumps([place(t, random.Random(int(sys.argv[2])))[0] for t in texts(12, seed=5)]))")
    for seed in ("1", "2", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        out = subprocess.run([sys.executable, "-c", code, str(ROOT), seed], env=env, capture_output=True, text=True,
                             check=True, cwd=ROOT).stdout
        assert json.loads(out) == here


def test_a_loaded_home_spills_in_rendezvous_order() -> None:
    t = texts(1, seed=9)[0]
    order = rendezvous_order(placement_key(t), URLS)  # type: ignore[arg-type]
    rng = random.Random(0)
    assert place(t, rng)[0] == order[0]
    # within the slack (2 requests above the least loaded): still home
    assert place(t, rng, {order[0]: 2}) == (order[0], "home")
    # above it: the next in the key's order, not the least loaded or a random one
    loads = {order[0]: 3, order[3]: 0, order[1]: 1, order[2]: 0}
    assert place(t, rng, loads) == (order[1], "home")
    loads = {order[0]: 3, order[1]: 3, order[2]: 1, order[3]: 0}
    assert place(t, rng, loads) == (order[2], "home")
    # the relative slack: at a least load of 20, 25 % (5 requests) above it is still within
    assert place(t, rng, {order[0]: 25, order[1]: 20, order[2]: 20, order[3]: 20})[0] == order[0]
    assert place(t, rng, {order[0]: 26, order[1]: 20, order[2]: 20, order[3]: 20})[0] == order[1]
    # an unavailable home: the next one
    ix = new_prefix_index(block_chars=64)
    views = [WorkerView(u, available=u != order[0]) for u in URLS]
    c = choose_prefill(hashes=ix.hashes(t), text_chars=len(t), workers=views, index=ix, now=0.0, cfg=CFG, rng=rng,
                       key=placement_key(t))
    assert c.url == order[1]


def test_many_keys_spread_evenly() -> None:
    counts = Counter(place(f"prompt {i}: " + "x" * 50, random.Random(i))[0] for i in range(4000))
    assert set(counts) == set(URLS)
    assert all(850 <= n <= 1150 for n in counts.values()), counts  # 1,000 each, +-15 %


def test_removing_a_worker_moves_only_its_keys() -> None:
    urls = [*URLS, "http://10.0.0.5:30000"]
    keys = [f"prompt {i}: " + "y" * 40 for i in range(2000)]
    before = {k: place(k, random.Random(0), urls=urls)[0] for k in keys}
    gone = urls[2]
    after = {k: place(k, random.Random(0), urls=[u for u in urls if u != gone])[0] for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved and all(before[k] == gone for k in moved)
    assert len(moved) == sum(1 for k in keys if before[k] == gone)
    assert len({after[k] for k in moved}) == 4  # its keys spread over the rest, not onto one worker


def test_ties_among_equal_holders_follow_the_rendezvous_order() -> None:
    views = [WorkerView(u) for u in URLS]
    ix = new_prefix_index(block_chars=64)
    for t in texts(10, seed=3):
        key = placement_key(t)
        assert key is not None
        holders = {URLS[0]: 500, URLS[2]: 500, URLS[3]: 0, URLS[1]: 0}
        picks = {choose_prefill(hashes=[], text_chars=0, workers=views, index=ix, now=0.0, cfg=CFG,
                                rng=random.Random(s), key=key, tokens=ScoreInputs(holders, 600, 600)).url for s in range(8)}
        assert picks == {next(u for u in rendezvous_order(key, URLS) if u in (URLS[0], URLS[2]))}
        # on the predicted index too (equal match, equal load)
        for u in (URLS[1], URLS[3]):
            ix.insert(ix.hashes(t), u, now=0.0)
        picks = {choose_prefill(hashes=ix.hashes(t + " q"), text_chars=len(t) + 2, workers=views, index=ix, now=1.0,
                                cfg=CFG, rng=random.Random(s), key=key).url for s in range(8)}
        assert picks == {next(u for u in rendezvous_order(key, URLS) if u in (URLS[1], URLS[3]))}
        ix = new_prefix_index(block_chars=64)


def test_the_key_covers_the_leading_characters_only() -> None:
    base = "p" * PLACEMENT_KEY_CHARS
    assert placement_key(base + "one") == placement_key(base + "two") == placement_key(base)
    assert placement_key(base[:-1] + "q") != placement_key(base)
    assert placement_key("short") != placement_key("shorter") and placement_key("") is None
    assert placement_key("\ud800 lone surrogate") is not None  # any str: JSON may carry one


def test_setting_from_profile_and_validated() -> None:
    assert RouterConfig().settings.miss_placement == policy_config(router_settings()).miss_placement == "power_of_two"
    assert from_profile(parse_profile_text(BASE), env={}).settings.miss_placement == "power_of_two"
    cfg = from_profile(parse_profile_text(BASE + "router: {miss_placement: rendezvous}\n"), env={})
    assert cfg.settings.miss_placement == "rendezvous"
    with pytest.raises(ProfileError) as info:
        parse_profile_text(BASE + "router: {miss_placement: hashed}\n", "p.yaml")
    assert any(e.startswith("router.miss_placement:") for e in info.value.errors), info.value.errors
    with pytest.raises(UsageError) as uinfo:  # set in code: refused by the same model
        RouterConfig(settings=router_settings(miss_placement="hashed")).validate()
    assert "router.miss_placement" in uinfo.value.message and "'hashed'" in uinfo.value.message


def test_serve_flag_is_validated(capsys: pytest.CaptureFixture[str]) -> None:
    from infer_ctl.cli.main import main

    assert main(["router", "serve", "--mixed", "http://127.0.0.1:9", "--miss-placement", "hashed"]) == 64
    err = capsys.readouterr().err
    assert "router.miss_placement" in err and "hashed" in err

"""`sglang.pd_role_switch` and `pd:`: launch renders --enable-pd-role-switch on prefill and decode servers,
and the profile refuses what SGLang refuses (role switching with speculative decoding, naming both fields)
and what the controller cannot do (act without role switching or without a router)."""

from __future__ import annotations

from typing import Any

import pytest

from infer_ctl.core.sglang.argv import build_argv
from infer_ctl.core.sglang.instance import instances
from infer_ctl.errors import ProfileError
from infer_ctl.profile.load import validate_profile_data


def _data(**extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "pdsw",
        "nodes": [{"name": "pf-01", "host": "10.0.0.11", "roles": ["prefill"]},
                  {"name": "dc-01", "host": "10.0.0.21", "roles": ["decode"]}],
        "models": {"target": {"path": "/m/t", "tp": 8}},
        "router": {"listen": "127.0.0.1:8000"},
    }
    for k, v in extra.items():
        base[k] = {**base.get(k, {}), **v} if isinstance(v, dict) else v
    return base


def test_launch_renders_the_flag_on_prefill_and_decode() -> None:
    prof = validate_profile_data(_data(sglang={"pd_role_switch": True}))
    for inst in instances(prof):
        assert "--enable-pd-role-switch" in build_argv(prof, inst).argv, inst.role
    plain = validate_profile_data(_data())
    assert all("--enable-pd-role-switch" not in build_argv(plain, i).argv for i in instances(plain))


def test_role_switch_with_speculative_decoding_is_refused_naming_both_fields() -> None:
    data = _data(sglang={"pd_role_switch": True})
    data["models"]["draft"] = {"path": "/m/eagle3", "algorithm": "EAGLE3", "num_steps": 3, "eagle_topk": 1,
                               "num_draft_tokens": 4}
    with pytest.raises(ProfileError) as exc:
        validate_profile_data(data)
    text = str(exc.value) + " ".join(getattr(exc.value, "errors", []) or [])
    assert "sglang.pd_role_switch" in text and "models.draft" in text and "speculative" in text


def test_act_needs_role_switching_and_a_router() -> None:
    with pytest.raises(ProfileError, match=r"pd\.control.*sglang\.pd_role_switch: true"):
        validate_profile_data(_data(pd={"control": "act"}))
    data = _data(pd={"control": "act"}, sglang={"pd_role_switch": True})
    del data["router"]
    with pytest.raises(ProfileError, match=r"pd\.control.*needs a router"):
        validate_profile_data(data)
    assert validate_profile_data(_data(pd={"control": "act"}, sglang={"pd_role_switch": True})).pd.control == "act"
    assert validate_profile_data(_data(pd={"control": "advise"})).pd.control == "advise"


def test_role_switch_on_a_collocated_profile_is_refused() -> None:
    data = _data(sglang={"pd_role_switch": True}, collocated=True)
    data["nodes"] = [{"name": "n1", "host": "10.0.0.11", "roles": ["prefill", "decode"]}]
    with pytest.raises(ProfileError, match=r"sglang\.pd_role_switch"):
        validate_profile_data(data)


def test_a_stale_limit_the_routers_polls_cannot_meet_is_refused() -> None:
    with pytest.raises(ProfileError, match=r"pd\.stale_s.*health_interval_s"):
        validate_profile_data(_data(pd={"control": "advise", "stale_s": 5}, router={"health_interval_s": 5}))
    assert validate_profile_data(_data(pd={"control": "off", "stale_s": 5}, router={"health_interval_s": 5}))

"""A simulated cluster reports the profile's speculative algorithm and draft model in /server_info, as
the real servers `launch` starts would: `router spec` and the request spans name what the profile says."""

from __future__ import annotations

from infer_ctl.profile.load import validate_profile_data
from infer_ctl.sim.from_profile import specs_from_profile
from infer_ctl.sim.info_api import server_args
from infer_ctl.sim.state import WorkerState

NODES = [{"name": "pf-01", "host": "10.9.9.1", "roles": ["prefill"]},
         {"name": "dc-01", "host": "10.9.9.2", "roles": ["decode"]}]


def _args(draft: dict[str, object] | None) -> list[dict[str, object]]:
    models: dict[str, object] = {"target": {"path": "/models/target", "preset": "llama-3.1-70b"}}
    if draft is not None:
        models["draft"] = draft
    profile = validate_profile_data({"name": "d", "nodes": NODES, "models": models})
    return [server_args(WorkerState(spec)) for spec in specs_from_profile(profile)]


def test_the_profile_draft_is_what_server_info_names() -> None:
    for args in _args({"path": "/models/my-eagle", "algorithm": "EAGLE", "num_steps": 3,
                       "eagle_topk": 1, "num_draft_tokens": 4}):
        assert args["speculative_draft_model_path"] == "/models/my-eagle"
        assert args["speculative_algorithm"] == "EAGLE"


def test_no_draft_no_speculative_fields() -> None:
    for args in _args(None):
        assert args["speculative_algorithm"] is None and args["speculative_draft_model_path"] is None

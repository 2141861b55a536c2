"""The `speculative:` section's settings under which the controller could never act: refused with one
error naming the field (exit 64), not accepted and silently idle."""

from __future__ import annotations

from typing import Any

import pytest

from infer_ctl.profile.load import validate_profile_data
from tests.unit.test_spec_profile import _errors, _with


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"min_requests": 500, "window_requests": 200}, "min_requests 500 is above window_requests 200"),
        ({"alert_threshold": 0.99, "hysteresis": 0.5}, "alert_threshold 0.99 + hysteresis 0.5 is not below 1"),
        ({"hysteresis": 0.2, "pools": [{"name": "a", "nodes": ["dc-01"], "alert_threshold": 0.9}]},
         "pools[0].alert_threshold 0.9 + hysteresis 0.2"),
        ({"cooldown_s": float("inf")}, "speculative.cooldown_s: Input should be a finite number"),
        ({"sustain_s": float("nan")}, "speculative.sustain_s"),
        ({"alert_threshold": "abc"}, "speculative.alert_threshold"),
        ({"alert_threshold": 1}, "speculative.alert_threshold"),
    ],
)
def test_unreachable_controller_settings_name_the_field(spec: dict[str, Any], fragment: str) -> None:
    errors = _errors(_with(**spec))
    assert any(fragment in e for e in errors), errors


def test_the_edges_that_still_work_are_accepted() -> None:
    profile = validate_profile_data(_with(min_requests=200, window_requests=200, alert_threshold=0.9, hysteresis=0.09))
    spec = profile.speculative
    assert spec is not None
    assert (spec.min_requests, spec.window_requests, spec.alert_threshold, spec.hysteresis) == (200, 200, 0.9, 0.09)

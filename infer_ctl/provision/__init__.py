"""Provisioning: steps that probe a node read-only, plan changes against the profile, apply them, verify.

`runner.plan_fleet` / `runner.apply_fleet` drive the steps of `steps.ALL_STEPS` over a Fleet; the pure
model (PlanEntry, diffs, desired state) lives in `infer_ctl.core.provision`.
"""

"""A rolling relaunch of ONE decode pool with other speculative settings: the controller's `act`.

The pool's servers are relaunched from the profile with the pool's setting changed in memory
(`core.spec.pools.with_pool_setting`: its own num_steps / num_draft_tokens, or --speculative-adaptive
with candidate steps and the config file that goes with it), through `launch --rolling` restricted to
the pool's nodes and role: one server at a time (max_unavailable 1; another decode keeps serving),
each drained from the running router and taken out of its pool before the restart
(launch/router_hook.py) and put back once healthy. Prefills and the other pools are not touched.
"""

from __future__ import annotations

from rich.console import Console

from infer_ctl.core.report import Report
from infer_ctl.core.spec.controller import PoolChange
from infer_ctl.core.spec.pools import Pool, with_pool_setting
from infer_ctl.launch.commands import launch
from infer_ctl.launch.spec_control import ActionResult
from infer_ctl.profile import Profile


def relaunch_pool(profile: Profile, pool: Pool, num_steps: int, adaptive_steps: tuple[int, ...] | None, *,
                  console: Console | None = None, timeout_s: float | None = None) -> Report:
    derived = with_pool_setting(profile, pool, num_steps, adaptive_steps)
    return launch(derived, ",".join(pool.nodes), pool.role, wait=True, timeout_s=timeout_s, rolling=True,
                  console=console, max_unavailable=1)


class SshRelauncher:
    """The controller's actuator on a real cluster (nodes over SSH)."""

    def __init__(self, profile: Profile, *, console: Console | None = None, timeout_s: float | None = None) -> None:
        self.profile = profile
        self.console = console
        self.timeout_s = timeout_s

    def apply(self, pool: Pool, change: PoolChange) -> ActionResult:
        if change.action == "restore":  # the operator's profile as it is
            report = launch(self.profile, ",".join(pool.nodes), pool.role, wait=True, timeout_s=self.timeout_s,
                            rolling=True, console=self.console, max_unavailable=1)
        else:
            report = relaunch_pool(self.profile, pool, change.num_steps, change.adaptive_steps,
                                   console=self.console, timeout_s=self.timeout_s)
        restarted = [r["instance"] for r in report.results or [] if r.get("action") in ("started", "restarted")]
        problems = [f"{f.check} {f.subject}: {f.message}" for f in report.findings if f.status.value == "fail"]
        ok = not problems and bool(restarted)
        msg = (f"relaunched {', '.join(restarted)} one at a time" if ok else
               "relaunch failed: " + ("; ".join(problems) if problems else "nothing was restarted"))
        return ActionResult(ok, msg, {"restarted": restarted, "exit_code": int(report.exit_code)})

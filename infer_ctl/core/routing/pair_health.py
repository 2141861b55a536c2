"""Which prefill x decode pairs the router avoids, and when they return: pure state, no I/O, no clock of
its own (every call gets `now`).

A pair is *degraded* for one of three reasons, each with its own way back:

- `pair_test`: the last P x D pair test of the audit (pushed through POST /admin/pairs) failed. It
  returns when a later push says the pair passed: the router itself cannot re-run an RDMA test.
- `kv_slow`: `bad_samples` consecutive KV transfers of the pair were slower than `min_speed_gb_s` or took
  longer than `max_latency_ms` (SGLang's own per-transfer numbers; see router/fleet/pair_health.py for where
  they come from). After `probe_after_s` the pair gets one request as a probe; a good transfer returns it,
  a bad one restarts the wait.
- `kv_failed`: `max_failures` consecutive requests on the pair failed in the KV transfer (the decode's
  error names the transfer or the bootstrap). Probed and returned like `kv_slow`, on the next success.

Avoiding is a preference, never a refusal: when every decode is degraded for the chosen prefill the
router still uses one (the caller falls back), because a slow pair serves and no pair does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

REASONS = ("pair_test", "kv_slow", "kv_failed")


@dataclass(frozen=True, kw_only=True)
class PairFloor:
    """The router's pair_health settings (profile/pair_health.py declares them; router/config.py
    `pair_floor` builds this): no default here."""

    min_speed_gb_s: float | None
    max_latency_ms: float | None
    bad_samples: int
    max_failures: int
    probe_after_s: float


@dataclass
class PairState:
    prefill: str
    decode: str
    #: the audit's last verdict: None (none pushed), "ok" or "fail"
    test: str | None = None
    test_reason: str | None = None
    test_at: float | None = None
    speed_gb_s: float | None = None
    latency_ms: float | None = None
    sample_at: float | None = None
    samples: int = 0
    bad_run: int = 0
    failures: int = 0
    transfers_failed: int = 0
    #: live degradation: "kv_slow" | "kv_failed" | None, since when, and when the next probe may go
    live: str | None = None
    live_since: float | None = None
    probe_at: float | None = None
    probing: bool = False

    @property
    def reason(self) -> str | None:
        return "pair_test" if self.test == "fail" else self.live

    def as_dict(self, now: float) -> dict[str, Any]:
        return {"prefill": self.prefill, "decode": self.decode, "degraded": self.reason is not None,
                "reason": self.reason, "pair_test": self.test, "pair_test_reason": self.test_reason,
                "kv_transfer_speed_gb_s": self.speed_gb_s, "kv_transfer_latency_ms": self.latency_ms,
                "samples": self.samples, "bad_samples": self.bad_run, "consecutive_failures": self.failures,
                "transfers_failed": self.transfers_failed,
                "degraded_for_s": None if self.live_since is None or self.live is None else round(now - self.live_since, 1),
                "probe_in_s": None if self.probe_at is None or self.live is None else round(max(0.0, self.probe_at - now), 1)}


class PairHealth:
    def __init__(self, floor: PairFloor) -> None:
        self.floor = floor
        self.pairs: dict[tuple[str, str], PairState] = {}

    def _get(self, prefill: str, decode: str) -> PairState:
        key = (prefill, decode)
        st = self.pairs.get(key)
        if st is None:
            st = self.pairs[key] = PairState(prefill, decode)
        return st

    # ---- inputs ----------------------------------------------------------------------------------
    def push(self, prefill: str, decode: str, status: str, reason: str | None, now: float) -> PairState:
        """The audit's verdict on the pair: "ok" returns a pair degraded by a test, "fail" degrades it."""
        if status not in ("ok", "fail"):
            raise ValueError("status is ok or fail")
        st = self._get(prefill, decode)
        st.test, st.test_reason, st.test_at = status, reason if status == "fail" else None, now
        return st

    def sample(self, prefill: str, decode: str, speed_gb_s: float | None, latency_ms: float | None,
               now: float) -> PairState:
        """One finished KV transfer of the pair, as SGLang measured it."""
        st = self._get(prefill, decode)
        st.speed_gb_s, st.latency_ms, st.sample_at = speed_gb_s, latency_ms, now
        st.samples += 1
        f = self.floor
        bad = (f.min_speed_gb_s is not None and speed_gb_s is not None and speed_gb_s < f.min_speed_gb_s) or \
              (f.max_latency_ms is not None and latency_ms is not None and latency_ms > f.max_latency_ms)
        st.probing = False
        if not bad:
            st.bad_run = 0
            if st.live == "kv_slow":
                st.live = st.live_since = st.probe_at = None
            return st
        st.bad_run += 1
        if st.live == "kv_slow":  # a failed probe: wait again
            st.probe_at = now + f.probe_after_s
        elif st.live is None and st.bad_run >= f.bad_samples:
            st.live, st.live_since, st.probe_at = "kv_slow", now, now + f.probe_after_s
        return st

    def outcome(self, prefill: str, decode: str, *, ok: bool, transfer_failed: bool, now: float) -> None:
        """A request's attempt on the pair ended: succeeded, or failed in the KV transfer (other failures
        are the worker's, judged by its circuit breaker, not the pair's)."""
        st = self.pairs.get((prefill, decode))
        if ok:
            if st is not None:
                st.failures = 0
                st.probing = False
                if st.live == "kv_failed":
                    st.live = st.live_since = st.probe_at = None
            return
        if not transfer_failed:
            if st is not None:
                st.probing = False
            return
        st = self._get(prefill, decode)
        st.failures += 1
        st.transfers_failed += 1
        st.probing = False
        if st.live is not None:
            st.probe_at = now + self.floor.probe_after_s
        elif st.failures >= self.floor.max_failures:
            st.live, st.live_since, st.probe_at = "kv_failed", now, now + self.floor.probe_after_s

    # ---- the picker's question -------------------------------------------------------------------------
    def avoid(self, prefill: str, decode: str, now: float) -> bool:
        """True while the pair is degraded, except for one probe request once its wait is over (the
        caller that routes to it calls `probe`)."""
        st = self.pairs.get((prefill, decode))
        if st is None or st.reason is None:
            return False
        if st.reason == "pair_test":
            return True
        return st.probing or st.probe_at is None or now < st.probe_at

    def probe(self, prefill: str, decode: str, now: float) -> bool:
        """Called for the pair just chosen: True when this request is the degraded pair's probe."""
        st = self.pairs.get((prefill, decode))
        if st is None or st.live is None or st.test == "fail" or st.probing:
            return False
        if st.probe_at is not None and now >= st.probe_at:
            st.probing = True
            st.probe_at = now + self.floor.probe_after_s  # a probe that never reports back retries later
            return True
        return False

    def degraded(self) -> list[PairState]:
        return [st for st in self.pairs.values() if st.reason is not None]

    def restarted(self, url: str) -> None:
        """A worker's process is new: what its pairs' live KV transfers said was about the process that
        is gone (a killed prefill fails every transfer until it is back), so their live degradation and
        counts start again; the audit's pair-test verdict stays (it is about the fabric)."""
        for key, st in self.pairs.items():
            if url in key:
                st.live = st.live_since = st.probe_at = None
                st.failures = st.bad_run = 0
                st.probing = False

    def forget(self, url: str) -> None:
        """A worker left the router: its pairs go with it."""
        for key in [k for k in self.pairs if url in k]:
            del self.pairs[key]

    def snapshot(self, now: float) -> list[dict[str, Any]]:
        return [st.as_dict(now) for st in sorted(self.pairs.values(), key=lambda s: (s.prefill, s.decode))]

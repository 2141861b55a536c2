"""What one simulated worker holds: its spec, timing model, tokenizer, radix cache, room table, engine,
ports and readiness. No aiohttp here.

The API modules (`info_api`, `native_api`, `openai_api`, `bootstrap`) and the request runner read a
`WorkerState`; `server.SimWorker` is a `WorkerState` that also owns the sockets and the lifecycle. The
engine and the room table are replaced on every start, so readers look them up per request
(`state.running_engine()`, `state.rooms`) rather than keeping their own references.
"""

from __future__ import annotations

from infer_ctl.sim.config import WorkerSpec
from infer_ctl.sim.engine import Engine
from infer_ctl.sim.kv_config import parse_kv_events_config
from infer_ctl.sim.kv_events import KvEventBuilder, KvEventRecorder
from infer_ctl.sim.kv_publisher import ZmqKvPublisher
from infer_ctl.sim.radix import RadixCache
from infer_ctl.sim.role_switch import RoleSwitchState
from infer_ctl.sim.rooms import RoomTable
from infer_ctl.sim.spec_decode import spec_decoder_for
from infer_ctl.sim.tiers import HiRadixCache
from infer_ctl.sim.tokenizer import make_tokenizer


class WorkerState:
    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.timing = spec.timing()
        self.tokenizer = make_tokenizer(spec.tokenizer_path)
        self.kv_events = parse_kv_events_config(spec.kv_events_config)
        #: SGLang keys an EAGLE worker's tree by bigrams (the simulator's speculative algorithm is EAGLE3)
        bigram = self.timing.spec_alpha is not None
        # A decode runs without a radix cache unless told otherwise (SGLang's handle_pd_disaggregation;
        # `decode_radix_cache` tells it otherwise),
        # and a disabled cache records no KV events: its publisher binds but never sends.
        records = self.kv_events is not None and self.kv_events.enabled and spec.radix_cache
        self.kv_recorder = KvEventRecorder() if records else None
        self.kv_publisher: ZmqKvPublisher | None = None
        tiers = spec.tier_config(self.timing)
        self.cache = RadixCache(
            self.timing.kv_capacity_tokens,
            spec.eviction_policy,
            page_size=spec.page_size,
            bigram=bigram,
            events=self.kv_recorder,
        ) if tiers is None else HiRadixCache(  # HiCache: host (and storage) tiers under HBM, sim/tiers.py
            self.timing.kv_capacity_tokens,
            tiers,
            spec.eviction_policy,
            page_size=spec.page_size,
            bigram=bigram,
            events=self.kv_recorder,
        )
        self.rooms = RoomTable()
        #: prefill: injected faults of its KV transfers per decode URL (sim/kv_faults.py); kept by restarts
        self.kv_faults: dict[str, dict[str, float | bool]] = {}
        self.engine: Engine | None = None
        #: the live role: the launch role (spec.role) until a POST /pd_role_switch changes it
        self.role: str = spec.role
        self.role_switch = RoleSwitchState(decode_graphs=spec.role == "decode")
        #: prefill KV managers registered with this worker's bootstrap server (none on a decode; a flip to
        #: prefill adds one, a flip away removes none: SGLang's CommonKVBootstrapServer never deregisters)
        self.bootstrap_registered = 1 if spec.role == "prefill" else 0
        self.kv_fetching = 0  # decode requests waiting for their KV (not yet in the engine)
        self.port = spec.port
        self.bootstrap_port: int | None = None
        self.start_time = 0.0
        self.ready = False

    @property
    def url(self) -> str:
        return f"http://{self.spec.host}:{self.port}"

    @property
    def mode(self) -> str:
        """SGLang's live disaggregation_mode ("null" on a mixed worker): the scheduler's, after a role switch."""
        return "null" if self.role == "mixed" else self.role

    @property
    def launch_mode(self) -> str:
        """The disaggregation_mode the worker was launched with: ServerArgs keep it across a role switch."""
        return "null" if self.spec.role == "mixed" else self.spec.role

    def make_engine(self) -> Engine:
        """A fresh engine for a start: queues, counters and the adaptive controller begin anew."""
        s = self.spec
        return Engine(
            self.role,
            self.timing,
            self.cache,
            time_scale=s.time_scale,
            seed=s.seed,
            spec=spec_decoder_for(s, self.timing),
            decode_radix=s.decode_radix_cache,
            retraction=s.decode_retraction,
        )

    def open_kv_events(self) -> None:
        """Start of a process: a new publisher (its seq starts at 0); what the recorder holds from before is dropped."""
        if self.kv_events is None or not self.kv_events.enabled:
            return
        build = KvEventBuilder(self.spec.page_size, bigram=self.cache.bigram).build
        self.kv_publisher = ZmqKvPublisher(self.kv_events, build=build)
        if self.kv_recorder is not None:
            self.kv_recorder.take()
            self.kv_recorder.sink = self.kv_publisher.publish

    def close_kv_events(self) -> None:
        if self.kv_recorder is not None:
            self.kv_recorder.sink = None
        if self.kv_publisher is not None:
            self.kv_publisher.close()
            self.kv_publisher = None

    def relaunch_role(self) -> None:
        self.role = self.spec.role
        self.role_switch = RoleSwitchState(decode_graphs=self.spec.role == "decode")
        self.bootstrap_registered = 1 if self.spec.role == "prefill" else 0

    @property
    def fully_idle(self) -> bool:
        """SGLang's `Scheduler.is_fully_idle`: nothing queued, running, waiting for a decode or for KV."""
        e = self.running_engine()
        return e.idle and not self.kv_fetching and not self.rooms.waiting_for_decode and not self.rooms.inflight

    def running_engine(self) -> Engine:
        assert self.engine is not None, "worker not started"
        return self.engine

"""What one simulated worker is: its role, address, model, seed and timing knobs (all defaulted)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from infer_ctl.sim.kv_config import parse_kv_events_config
from infer_ctl.sim.spec_adaptive import launch_steps
from infer_ctl.sim.spec_workload import SpecWorkload
from infer_ctl.sim.tiers import (
    PREFETCH_POLICIES,
    WRITE_POLICIES,
    HostMemoryMode,
    PrefetchPolicy,
    TierConfig,
    WritePolicy,
)
from infer_ctl.sim.timing import DEFAULT_PRESET, TimingModel, preset, resolve_timing

Role = Literal["prefill", "decode", "mixed"]
ROLES = ("prefill", "decode", "mixed")
SGLANG_VERSION = "0.5.23"
#: SGLang's --disaggregation-bootstrap-port default
DEFAULT_BOOTSTRAP_PORT = 8998
#: SGLang's FAKE_BOOTSTRAP_HOST: requests carrying it use the fake KV sender/receiver (no pairing)
FAKE_BOOTSTRAP_HOST = "2.2.2.2"


@dataclass
class WorkerSpec:
    role: Role
    host: str = "127.0.0.1"
    port: int = 0  # 0 = pick a free port
    #: prefill: its bootstrap server's port (None or 0 = pick a free one); decode: the port used when a
    #: request carries bootstrap_port null (SGLang's --disaggregation-bootstrap-port, default 8998)
    bootstrap_port: int | None = None
    model: str = "sim-llama-3.1-70b"
    seed: int = 0
    preset: str = DEFAULT_PRESET
    #: wall seconds per model second: 0.1 runs ten times faster than the modelled hardware
    time_scale: float = 1.0
    #: radix cache / KV pool capacity in tokens; None = what fits in HBM next to the weights
    cache_capacity_tokens: int | None = None
    eviction_policy: Literal["lru", "priority"] = "lru"
    max_running_requests: int | None = None
    chunked_prefill_size: int | None = None
    context_length: int = 131_072
    #: None = the preset's (EAGLE3 on the default preset); False = off
    speculative: bool | None = None
    spec_alpha: float | None = None
    spec_gamma: int | None = None
    spec_cost_ratio: float | None = None
    #: what /server_info reports as --speculative-algorithm / --speculative-draft-model-path (the
    #: profile's models.draft under `sim serve --from-profile` and `demo`; None: "<model>-eagle3-draft")
    spec_algorithm: str = "EAGLE3"
    draft_model: str | None = None
    #: per-domain alpha, drift, a mismatched draft tokenizer (docs/simulator.md "Speculative decoding");
    #: one object per worker, kept by a restart (dataclasses.replace shares it)
    spec_workload: SpecWorkload = field(default_factory=SpecWorkload)
    #: SGLang's --speculative-adaptive / --speculative-adaptive-config (a JSON path, or the dict itself)
    spec_adaptive: bool = False
    spec_adaptive_config: str | dict[str, Any] | None = None
    #: SGLang's --decode-log-interval: the speculative gauges are recomputed every this many decode batches
    decode_log_interval: int = 40
    prefill_mfu: float | None = None
    bandwidth_efficiency: float | None = None
    step_overhead_s: float | None = None
    tokenizer_path: str | None = None
    #: SGLang's defaults are 300 s (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT / _WAITING_TIMEOUT); the
    #: simulator's are shorter so a mispaired request fails within a test's patience. Wall seconds.
    bootstrap_timeout_s: float = 30.0
    waiting_timeout_s: float = 30.0
    #: fill usage.prompt_tokens_details.cached_tokens (SGLang: --enable-cache-report, default off)
    enable_cache_report: bool = True
    #: SGLang's --page-size: the radix tree holds whole pages, KV events carry one block per page
    page_size: int = 1
    #: SGLang's --kv-events-config JSON (kv_config.py); None: no KV events
    kv_events_config: str | None = None
    #: SGLang's --disaggregation-decode-enable-radix-cache (decode only): the decode keeps a prefix cache
    #: of its own, matched before each request's KV transfer, filled with finished sequences; without it
    #: a PD decode runs no radix cache (handle_pd_disaggregation), and HiCache settings are ignored there
    decode_radix_cache: bool = False
    #: HiCache (sim/tiers.py): a host tier of --hicache-ratio x the HBM pool, or --hicache-size GB per
    #: rank; neither: no host tier. Prefill and mixed workers, and decodes with decode_radix_cache.
    hicache_ratio: float | None = None
    hicache_size_gb: float | None = None
    hicache_write_policy: WritePolicy = "write_through"
    #: host <-> GPU bandwidth per GPU (PCIe, effective; `inferctl plan tiers --pcie-gbs`'s default)
    hicache_host_gb_s: float = 50.0
    #: an L3 tier under the host tier (--hicache-storage-backend); capacity in GB of KV (None: unbounded)
    hicache_storage_backend: str | None = None
    hicache_storage_gb: float | None = None
    #: the storage's read bandwidth for this server (GB/s; an NVMe drive gives a few)
    hicache_storage_gb_s: float = 5.0
    hicache_prefetch_policy: PrefetchPolicy = "timeout"
    #: --hicache-host-memory-mode: cache, or buffer_only (host memory only stages to storage)
    hicache_host_memory_mode: HostMemoryMode = "cache"
    #: SGLang's --admin-api-key: the admin endpoints (`/hicache/storage-backend`) answer only with it
    #: (as a bearer token); without it they answer 400 "requires admin API key" (sim/hicache_api.py)
    admin_api_key: str | None = None
    #: SGLang's --enable-pd-role-switch: POST /pd_role_switch moves the worker between prefill and decode
    #: (sim/role_switch.py); its bootstrap server then runs in either role
    enable_pd_role_switch: bool = False
    #: SGLang's decode admission and retraction: admit on the tokens held so far plus 512 reserved, retract
    #: the request with the fewest output tokens when the KV pool runs out (counted per request as
    #: meta_info num_retractions). Off: admission reserves prompt + max_new_tokens, nothing is retracted
    decode_retraction: bool = False

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")
        if self.time_scale <= 0:
            raise ValueError(f"time_scale must be positive, got {self.time_scale}")
        if self.page_size < 1:
            raise ValueError(f"page_size must be at least 1, got {self.page_size}")
        parse_kv_events_config(self.kv_events_config)  # refused here, as SGLang refuses it at start-up
        if self.decode_log_interval < 1:
            raise ValueError(f"decode_log_interval must be >= 1, got {self.decode_log_interval}")
        if self.spec_adaptive:
            launch_steps(self.spec_gamma, self.spec_adaptive_config)  # SGLang refuses a non-candidate
        if self.hicache_ratio is not None and self.hicache_ratio <= 0:
            raise ValueError(f"hicache_ratio must be positive, got {self.hicache_ratio}")
        if self.hicache_size_gb is not None and self.hicache_size_gb <= 0:
            raise ValueError(f"hicache_size_gb must be positive, got {self.hicache_size_gb}")
        if self.hicache_write_policy not in WRITE_POLICIES:
            raise ValueError(f"hicache_write_policy must be one of {', '.join(WRITE_POLICIES)}, got {self.hicache_write_policy!r}")
        if self.hicache_prefetch_policy not in PREFETCH_POLICIES:
            raise ValueError(f"hicache_prefetch_policy must be one of {', '.join(PREFETCH_POLICIES)}, "
                             f"got {self.hicache_prefetch_policy!r}")
        if self.decode_radix_cache and self.role != "decode":
            raise ValueError("decode_radix_cache is a decode setting (--disaggregation-decode-enable-radix-cache)")
        if self.hicache_host_memory_mode not in ("cache", "buffer_only"):
            raise ValueError(f"hicache_host_memory_mode must be 'cache' or 'buffer_only', got "
                             f"{self.hicache_host_memory_mode!r}")
        if self.hicache_host_memory_mode == "buffer_only" and self.hicache:
            # validate_hicache_host_memory_mode (arg_groups/hicache_hook.py), SGLang's messages
            if self.hicache_storage_backend is None:
                raise ValueError("--hicache-host-memory-mode buffer_only requires a storage backend "
                                 "(--hicache-storage-backend)")
            if self.role == "decode":
                raise ValueError("--hicache-host-memory-mode buffer_only is not supported on decode instances")
        if self.enable_pd_role_switch and self.timing().spec_alpha is not None:
            # SGLang 0.5.23 refuses it at launch (arg_groups/pd_disaggregation_hook.py): the draft's state is
            # role-specific and not rebuilt on a flip
            raise ValueError("--enable-pd-role-switch does not rebuild role-specific state for the following "
                             "features: speculative decoding (--speculative-algorithm EAGLE3). Remove these "
                             "options or drop --enable-pd-role-switch.")
        if self.hicache_storage_backend is not None and self.hicache_ratio is None and self.hicache_size_gb is None:
            raise ValueError("a HiCache storage backend needs a host tier (hicache_ratio or hicache_size_gb)")

    @property
    def hicache(self) -> bool:
        """Whether this worker runs HiCache (a host tier under its radix cache)."""
        tiered = self.hicache_ratio is not None or self.hicache_size_gb is not None
        return tiered and (self.role != "decode" or self.decode_radix_cache)

    @property
    def radix_cache(self) -> bool:
        """Whether this worker runs a radix cache at all (a PD decode only with decode_radix_cache)."""
        return self.role != "decode" or self.decode_radix_cache

    def tier_config(self, timing: TimingModel) -> TierConfig | None:
        """The tiers of this worker, sized as SGLang sizes them (HostKVCache: --hicache-size GB per rank
        // bytes per token per rank, else the device pool x the ratio), or None without HiCache."""
        if not self.hicache:
            return None
        gpus = preset(self.preset).gpus
        per_rank = max(1, timing.kv_bytes_per_token // gpus)
        if self.hicache_size_gb is not None:
            host = int(self.hicache_size_gb * 1e9 // per_rank)
        else:
            host = int(timing.kv_capacity_tokens * (self.hicache_ratio or 0))
        storage = None if self.hicache_storage_gb is None else int(self.hicache_storage_gb * 1e9 // per_rank)
        return TierConfig(
            host_capacity_tokens=max(1, host),
            kv_bytes_per_token=timing.kv_bytes_per_token,
            host_bytes_s=self.hicache_host_gb_s * 1e9 * gpus,
            write_policy=self.hicache_write_policy,
            storage_backend=self.hicache_storage_backend,
            storage_capacity_tokens=storage,
            storage_bytes_s=self.hicache_storage_gb_s * 1e9,
            prefetch_policy=self.hicache_prefetch_policy,
            host_memory_mode=self.hicache_host_memory_mode,
        )

    def timing(self) -> TimingModel:
        return resolve_timing(
            self.preset,
            self.role,
            cache_capacity_tokens=self.cache_capacity_tokens,
            speculative=self.speculative,
            max_running_requests=self.max_running_requests,
            chunked_prefill_size=self.chunked_prefill_size,
            spec_alpha=self.spec_alpha,
            spec_gamma=launch_steps(self.spec_gamma, self.spec_adaptive_config)
            if self.spec_adaptive
            else self.spec_gamma,
            spec_cost_ratio=self.spec_cost_ratio,
            prefill_mfu=self.prefill_mfu,
            bandwidth_efficiency=self.bandwidth_efficiency,
            step_overhead_s=self.step_overhead_s,
        )

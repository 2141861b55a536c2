"""router.tenants and router.pricing: who sends requests, their limits, and what the workers cost
(docs/observability.md).

A tenant is identified by an API key (a bearer token). The profile never holds a key in clear: it holds
the key's SHA-256 (`key_sha256`), or names the environment variable (`key_env`) or file (`key_file`)
the router reads the key from at start-up (and then keeps only its hash). SHA-256, not a slow password
hash: API keys are random tokens of at least 128 bits, which no hash speed makes guessable, while an
argon2/bcrypt check on every request would cost the data plane tens of milliseconds. With no key
configured at all, the tenant is named by a header (`tenant_header`) instead.
"""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Self

from pydantic import Field, model_validator

from infer_ctl.profile.base import StrictModel

TENANT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
#: label cardinality of the per-tenant metrics is bounded by the configuration: this many at most
MAX_TENANTS = 256
#: shortest key accepted from key_env / key_file (characters): a short key is a guessable key
MIN_KEY_CHARS = 24
_PREFIX = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]


class Tenant(StrictModel):
    name: Annotated[str, Field(pattern=TENANT_NAME_PATTERN)]
    #: the API key's SHA-256, 64 hex digits (`inferctl router tenant-key` makes a key and its hash)
    key_sha256: Annotated[str, Field(pattern=r"^[0-9a-fA-F]{64}$")] | None = None
    #: or: the environment variable holding the key
    key_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] | None = None
    #: or: a file holding the key (relative paths resolve against the profile's directory)
    key_file: str | None = None
    #: token bucket on requests: sustained rate and burst (default: one second's worth, at least 1)
    requests_per_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    burst: Annotated[int, Field(ge=1)] | None = None
    #: token bucket on prompt + completion tokens: an estimate reserved at admission, settled with what the
    #: workers report when the request ends (router/observe/tenants.py)
    tokens_per_min: Annotated[int, Field(ge=1)] | None = None
    max_concurrency: Annotated[int, Field(ge=1)] | None = None
    #: named prefixes (router.prefixes) whose warm replicas this tenant's requests may use; None: all
    prefixes: list[_PREFIX] | None = None
    #: sent to SGLang as the request's `priority` (replacing the client's); scheduling order needs the
    #: workers' --enable-priority-scheduling, eviction order --radix-eviction-policy priority
    priority: int | None = None

    @model_validator(mode="after")
    def _one_key_source(self) -> Self:
        given = [k for k in ("key_sha256", "key_env", "key_file") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give at most one of key_sha256, key_env or key_file (got {', '.join(given)})")
        if self.burst is not None and self.requests_per_s is None:
            raise ValueError("burst is the requests_per_s bucket's size: give requests_per_s too")
        return self

    @property
    def has_key(self) -> bool:
        return self.key_sha256 is not None or self.key_env is not None or self.key_file is not None


class RolePricing(StrictModel):
    """The lease of one role's nodes, per node-hour or per GPU-hour."""

    node_hour_usd: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    gpu_hour_usd: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    #: GPUs per node; None: the profile's nodes of this role (8 when it has none)
    gpus_per_node: Annotated[int, Field(ge=1, le=64)] | None = None

    @model_validator(mode="after")
    def _one_price(self) -> Self:
        if (self.node_hour_usd is None) == (self.gpu_hour_usd is None):
            raise ValueError("give exactly one of node_hour_usd or gpu_hour_usd")
        return self


class Pricing(StrictModel):
    prefill: RolePricing | None = None
    decode: RolePricing | None = None
    collocated: RolePricing | None = None


def tenant_problems(tenants: list[Tenant]) -> list[tuple[tuple[str | int, ...], str]]:
    """Rules across tenants: unique names and hashes, keys for all or none, the cardinality bound."""
    out: list[tuple[tuple[str | int, ...], str]] = []
    if len(tenants) > MAX_TENANTS:
        out.append(((), f"{len(tenants)} tenants: at most {MAX_TENANTS} (each is a metrics label value)"))
    names = Counter(t.name for t in tenants)
    hashes = Counter(t.key_sha256.lower() for t in tenants if t.key_sha256)
    keyed = [t.has_key for t in tenants]
    for i, t in enumerate(tenants):
        if names[t.name] > 1:
            out.append(((i, "name"), f"duplicate tenant name {t.name!r}"))
        if t.key_sha256 and hashes[t.key_sha256.lower()] > 1:
            out.append(((i, "key_sha256"), f"tenant {t.name!r} shares its key with another tenant"))
        if any(keyed) and not t.has_key:
            out.append(((i,), f"tenant {t.name!r} has no key while others do: give every tenant a key "
                              "(key_sha256, key_env or key_file), or none (tenants named by tenant_header)"))
    return out

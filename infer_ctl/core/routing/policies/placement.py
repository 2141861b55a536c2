"""Rendezvous placement of a prompt no worker holds (miss_placement "rendezvous").

The prompt's *home*: rendezvous (highest-random-weight) hashing of a stable key, the first
`PLACEMENT_KEY_CHARS` characters of the routing text (`placement_key`: blake2b, the same in every router
process and replica, unlike Python's per-process `hash()`), among the available workers whose load is within
`miss_slack` requests (or `miss_slack_rel` of the least load, whichever is more) of the least-loaded one; a
hot home spills to the next worker in the key's rendezvous order. So every process and replica places a
burst of one new prefix on one worker instead of each on its own random one, and removing a worker moves
only the keys it was home to. The same order breaks ties among equally good holders (cache_aware.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from infer_ctl.core.routing.policies.base import PolicyConfig, WorkerView

#: characters of the routing text the placement key covers (docs/router.md "Routing policy": long
#: enough that unrelated prompts rarely share it, short enough to sit inside a system prompt; a prompt
#: shorter than this is keyed on all of it)
PLACEMENT_KEY_CHARS = 1024
MISS_PLACEMENTS = ("power_of_two", "rendezvous")


def placement_key(text: str, chars: int = PLACEMENT_KEY_CHARS) -> bytes | None:
    """The prompt's stable placement key: a digest of its first `chars` characters, identical in every
    process and replica (no PYTHONHASHSEED); None for an empty prompt."""
    if not text:
        return None
    return hashlib.blake2b(text[:chars].encode("utf-8", "surrogatepass"), digest_size=16).digest()


def rendezvous_rank(key: bytes, url: str) -> int:
    """The worker's weight for `key` (highest first): a hash of both, so each key orders the workers
    independently and dropping one worker moves only the keys whose first choice it was."""
    return int.from_bytes(hashlib.blake2b(key + url.encode(), digest_size=8).digest(), "big")


def home(cands: Sequence[WorkerView], key: bytes, cfg: PolicyConfig) -> WorkerView:
    """The first worker in the key's rendezvous order whose load is within the slack of the least
    loaded (bounded load: the least-loaded worker always qualifies)."""
    min_load = min(w.load for w in cands)
    limit = min_load + max(cfg.miss_slack, cfg.miss_slack_rel * min_load)
    return max((w for w in cands if w.load <= limit), key=lambda w: rendezvous_rank(key, w.url))

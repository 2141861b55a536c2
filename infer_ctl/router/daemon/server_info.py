"""The router's /server_info in PD mode: the first answering prefill's document, as before (the fields a
client reads of one SGLang server), plus `{"prefill": [...], "decode": [...]}`, every worker's own
document per role - the shape SGLang's gateway answers. sglang 0.5.23's bench_serving reads the accept
length from it: `info["decode"][0]["internal_states"][0]["avg_spec_accept_length"]` when "decode" is
present (benchmark/serving.py), and only the decode knows it (speculative decoding runs there).

So a list is present only when one of its workers answered (bench_serving indexes `[0]` blindly), and
available workers come first (a decode held down by the health checks may answer with stale numbers)."""

from __future__ import annotations

import asyncio
from typing import Any

from infer_ctl.router.fleet.workers import WorkerState
from infer_ctl.router.http.jsonio import loads_or_none
from infer_ctl.router.http.upstream import UpstreamError

#: seconds each worker gets to answer (the same as the single-worker proxy's)
_TIMEOUT_S = 10.0


async def _info(router: Any, w: WorkerState) -> Any:
    try:
        status, data = await asyncio.wait_for(router.upstreams.fetch(w.url, "GET", "/server_info"), _TIMEOUT_S)
    except (UpstreamError, TimeoutError):
        return None
    doc = loads_or_none(data) if status == 200 else None
    return doc if isinstance(doc, dict) else None


async def pd_server_info(router: Any) -> dict[str, Any] | None:
    """None when no worker answered with a JSON object."""
    now = router.clock()
    roles = {role: sorted(router.workers.role(role), key=lambda w: not w.available(now))
             for role in ("prefill", "decode")}
    answers = await asyncio.gather(*(_info(router, w) for ws in roles.values() for w in ws))
    it = iter(answers)
    lists = {role: [doc for doc in (next(it) for _ in ws) if doc is not None] for role, ws in roles.items()}
    if not lists["prefill"] and not lists["decode"]:
        return None
    top = lists["prefill"][0] if lists["prefill"] else lists["decode"][0]
    doc = {k: v for k, v in top.items() if k not in ("prefill", "decode")}
    doc.update({role: docs for role, docs in lists.items() if docs})
    return doc

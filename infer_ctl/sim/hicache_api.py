"""HiCache's runtime storage-backend endpoints, as SGLang 0.5.23 serves them
(sglang/srt/entrypoints/http_server.py, managers/scheduler.py, mem_cache/unified_cache/storage_attachment.py):

- `GET /hicache/storage-backend`: the tokenizer-side view, `{"hicache_storage_backend",
  "hicache_storage_backend_extra_config", "hicache_storage_prefetch_policy", "hicache_write_policy"}`;
- `PUT /hicache/storage-backend` with an `AttachHiCacheStorageReqInput` body
  (`hicache_storage_backend` required; `hicache_storage_backend_extra_config_json`,
  `hicache_storage_prefetch_policy`, `hicache_write_policy` optional): attach, or with the same backend
  attached, update the policies; another backend is refused ("Detach first.");
- `DELETE /hicache/storage-backend`: detach (idempotent);
- `POST /hicache/storage-backend/clear`: delete the backend's contents.

Auth (`AuthLevel.ADMIN_OPTIONAL`, sglang/srt/utils/auth.py, with --admin-api-key set): the bearer token
must be the admin key, else 401 `{"error": "Unauthorized"}`; the first three handlers then refuse to run
on a server started without an admin key: 400 `{"error": "This endpoint requires admin API key, ..."}`
(`_admin_api_key_missing_response`); clear needs no key when none is configured. Attach and detach run
only with no request queued or running (the scheduler's `is_fully_idle`), and only with HiCache on. A
server's `--api-key` is not modelled (the simulator has none). Bodies: 200 / 400 with SGLang's text
("HiCache storage backend attached.\\n" + the scheduler's message); an invalid body is FastAPI's 422.
A restart (`relaunch`) goes back to the launch configuration, as a new SGLang process would.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from aiohttp import web

from infer_ctl.sim.state import WorkerState
from infer_ctl.sim.tiers import PREFETCH_POLICIES, WRITE_POLICIES, HiRadixCache

#: --hicache-storage-backend choices of SGLang 0.5.23 (arg_groups/fields/memory.py); another name fails
#: in StorageBackendFactory ("Unknown storage backend")
BACKENDS = ("file", "sim", "mooncake", "npu_memcache", "hf3fs", "nixl", "aibrix", "dynamic", "eic", "simm", "mori",
            "shm", "tensorcast", "seaweedfs")  # fmt: skip
MISSING_ADMIN_KEY = ("This endpoint requires admin API key, but this server was started without one "
                     "(admin-api-key). Restart with --admin-api-key to enable.")  # fmt: skip
ATTACH_FIELDS = {"hicache_storage_backend": True, "hicache_storage_backend_extra_config_json": False,
                 "hicache_storage_prefetch_policy": False, "hicache_write_policy": False}  # fmt: skip


def _bearer_ok(header: str | None, key: str) -> bool:
    """sglang/srt/utils/auth.py `_check_bearer_token`: "Bearer <key>" (scheme case-insensitive)."""
    if not header:
        return False
    parts = header.split(" ", 1)
    return len(parts) == 2 and parts[0].lower() == "bearer" and hmac.compare_digest(parts[1], key)


class HiCacheApi:
    def __init__(self, state: WorkerState) -> None:
        self.state = state
        self.config: dict[str, Any] = {}
        self.relaunch()

    def relaunch(self) -> None:
        """A process start: the launch flags' values, the launch tiers (the caller resets the cache)."""
        s, cache = self.state.spec, self.state.cache
        if isinstance(cache, HiRadixCache):
            cache.relaunch()
        self.config = {
            "hicache_storage_backend": s.hicache_storage_backend,
            "hicache_storage_backend_extra_config": None,
            "hicache_storage_prefetch_policy": s.hicache_prefetch_policy,
            # the resolved policy (buffer_only runs write_back as write_through)
            "hicache_write_policy": cache.tiers.write_policy if isinstance(cache, HiRadixCache) else s.hicache_write_policy,
        }

    # -- auth -------------------------------------------------------------------------------------
    def _refused(self, request: web.Request, *, needs_key: bool = True) -> web.Response | None:
        key = self.state.spec.admin_api_key
        if key is not None and not _bearer_ok(request.headers.get("Authorization"), key):
            return web.json_response({"error": "Unauthorized"}, status=401)
        if key is None and needs_key:
            return web.json_response({"error": MISSING_ADMIN_KEY}, status=400)
        return None

    def _busy(self, verb: str) -> str | None:
        """The scheduler's refusals before the cache is touched (attach/detach_hicache_storage_wrapped)."""
        if not isinstance(self.state.cache, HiRadixCache):
            return "Hierarchical cache is not enabled."
        e = self.state.running_engine()
        if not e.idle:
            return (f"Reject {verb}: scheduler is not idle. #queue-req={len(e.prefill_queue) + len(e.decode_waiting)} "
                    f"#running-req={len(e.running)}")
        return None

    # -- handlers -----------------------------------------------------------------------------------
    async def status(self, request: web.Request) -> web.Response:
        refused = self._refused(request)
        return refused or web.json_response(self.config)

    async def attach(self, request: web.Request) -> web.Response:
        refused = self._refused(request)
        if refused:
            return refused
        body, error = await _attach_body(request)
        if body is None:
            return web.json_response({"detail": error}, status=422)
        ok, msg = self._attach(body)
        head = "HiCache storage backend attached.\n" if ok else "Failed to attach HiCache storage backend.\n"
        return web.Response(text=head + (msg + "\n" if msg else ""), status=200 if ok else 400)

    def _attach(self, body: dict[str, Any]) -> tuple[bool, str]:
        busy = self._busy("attach")
        if busy:
            return False, busy
        cache = self.state.cache
        assert isinstance(cache, HiRadixCache)
        backend = body["hicache_storage_backend"]
        prefetch, write = body.get("hicache_storage_prefetch_policy"), body.get("hicache_write_policy")
        if prefetch is not None and prefetch not in PREFETCH_POLICIES:
            return False, f"Invalid hicache_storage_prefetch_policy: {prefetch!r}. Expected one of {list(PREFETCH_POLICIES)}."
        if write is not None and write not in WRITE_POLICIES:
            return False, f"Invalid hicache_write_policy: {write!r}. Expected one of {list(WRITE_POLICIES)}."
        current = cache.tiers.storage_backend
        if current is not None and current != backend:
            return False, (f"HiCache storage backend is already enabled with backend '{current}'. Cannot attach "
                           f"different backend '{backend}'. Detach first.")
        same = current is not None
        extra_json = body.get("hicache_storage_backend_extra_config_json")
        timeouts: dict[str, float] = {}
        if not same:
            try:
                extra = json.loads(extra_json) if extra_json else {}
                if not isinstance(extra, dict):
                    raise ValueError("not a JSON object")
                for key in ("prefetch_timeout_base", "prefetch_timeout_per_ki_token"):
                    if key in extra:
                        timeouts[key] = float(extra[key])
            except (ValueError, TypeError) as exc:  # SGLang also reads "@file"; the simulator has no node files
                return False, f"Failed to parse storage_backend_extra_config_json '{extra_json}': {exc}"
            if backend not in BACKENDS:
                return False, f"Failed to attach storage backend '{backend}': Unknown storage backend '{backend}'."
        cache.attach_storage(backend, prefetch_policy=prefetch, write_policy=write,
                             timeout_base_s=timeouts.get("prefetch_timeout_base"),
                             timeout_per_ki_token_s=timeouts.get("prefetch_timeout_per_ki_token"))  # fmt: skip
        # the tokenizer-side record: only the fields the request gave (record_config_updates)
        self.config["hicache_storage_backend"] = backend
        if extra_json is not None:
            self.config["hicache_storage_backend_extra_config"] = extra_json
        if prefetch is not None:
            self.config["hicache_storage_prefetch_policy"] = prefetch
        if write is not None:
            self.config["hicache_write_policy"] = write
        if same:
            return True, "HiCache storage backend already enabled with same backend; policies updated."
        return True, "Attached HiCache storage backend successfully."

    async def detach(self, request: web.Request) -> web.Response:
        refused = self._refused(request)
        if refused:
            return refused
        busy = self._busy("detach")
        if busy:
            return web.Response(text=f"Failed to detach HiCache storage backend.\n{busy}\n", status=400)
        cache = self.state.cache
        assert isinstance(cache, HiRadixCache)
        cache.detach_storage()
        self.config["hicache_storage_backend"] = None
        self.config["hicache_storage_backend_extra_config"] = None
        return web.Response(text="HiCache storage backend detached.\nDetached HiCache storage backend successfully.\n")

    async def clear(self, request: web.Request) -> web.Response:
        refused = self._refused(request, needs_key=False)
        if refused:
            return refused
        ok = isinstance(self.state.cache, HiRadixCache)
        if ok:
            assert isinstance(self.state.cache, HiRadixCache)
            self.state.cache.clear_storage()
        return web.Response(text="Hierarchical cache storage backend cleared.\n", status=200 if ok else 400)


async def _attach_body(request: web.Request) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The body as FastAPI validates `AttachHiCacheStorageReqInput` (pydantic, extra keys ignored), or
    FastAPI's 422 detail list."""
    try:
        raw = await request.json()
    except ValueError as exc:
        return None, [{"type": "json_invalid", "loc": ["body", 0], "msg": "JSON decode error",
                       "input": {}, "ctx": {"error": str(exc)}}]  # fmt: skip
    if not isinstance(raw, dict):
        return None, [{"type": "model_attributes_type", "loc": ["body"], "msg": "Input should be a valid dictionary "
                       "or object to extract fields from", "input": raw}]  # fmt: skip
    errors: list[dict[str, Any]] = []
    for name, required in ATTACH_FIELDS.items():
        value = raw.get(name)
        if name not in raw and required:
            errors.append({"type": "missing", "loc": ["body", name], "msg": "Field required", "input": raw})
        elif (value is not None and not isinstance(value, str)) or (required and name in raw and value is None):
            errors.append({"type": "string_type", "loc": ["body", name], "msg": "Input should be a valid string",
                           "input": value})  # fmt: skip
    if errors:
        return None, errors
    return {k: raw.get(k) for k in ATTACH_FIELDS}, []

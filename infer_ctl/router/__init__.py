"""The router daemon: an asyncio HTTP server in front of SGLang prefill/decode (or collocated) workers.

Sub-packages by job, in layers (docs/router.md, "Code map"; the `router-rooms` import-linter contract
in pyproject.toml: a room imports only the rooms below it):
- daemon: server (endpoints, lifecycle, drain), run (foreground daemon), embed (run in a thread), procs
  (the `--processes N` supervisor), admin_dir (the single process's admin socket directory)
- control: admin (operator API), health (active checks), warmer (named prefixes), client (the CLI's
  admin client)
- scaleout: follow (process leader/followers), metrics_merge (one /metrics for all processes),
  state_sync (replicas over Redis)
- request: the request path - proxy (entry point, `Router`), observe (per-request tracing/tenant
  hooks), admission, context, retry, picker, coalesce, attempt, relay, calls (upstream calls with
  per-worker accounting), feedback, usage, recovery and stream (mid-stream recovery)
- fleet: workers (runtime worker state), pair_health, metrics, shared_load and shared_flights (shared
  by the processes)
- config (module): RouterConfig
- kvindex: kv_routing (kv_discovery, kv_anchoring), kv_subscriber (stream_state, replay_cursor, stream_blocks,
  kv_socket), kv_prompts, kv_settings; observe: tracing, tenants, spec_stats, logs (the two do not import each other)
- http: h1 (the data-plane HTTP/1.1 server), upstream (keep-alive HTTP/1.1 client), sse, jsonio
Policy decisions are pure functions in infer_ctl.core.routing.
"""

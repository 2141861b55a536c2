"""The router daemon: an asyncio HTTP server in front of SGLang prefill/decode (or collocated) workers.

Modules (docs/router.md, "Code map"): server (endpoints, lifecycle, drain) on h1 (the data-plane HTTP
server); the request path - proxy (entry point, `Router`), admission, context, retry, picker, attempt,
relay, calls (upstream calls with per-worker accounting), feedback - on upstream (keep-alive HTTP/1.1
client); workers (runtime worker state), health (active checks), warmer (named prefixes), admin
(operator API), metrics; config, embed (run in a thread), run (foreground daemon), client (the CLI's
admin client), jsonio, sse, usage, logs. Policy decisions are pure functions in infer_ctl.core.routing.
"""

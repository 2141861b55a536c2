"""The router daemon: an asyncio HTTP server in front of SGLang prefill/decode (or collocated) workers.

Modules: config (settings), upstream (keep-alive HTTP/1.1 client), workers (runtime worker state),
proxy (the PD and collocated request paths), health (active checks), prefix_warmer (named prefixes),
admin (operator API), metrics, server (HTTP endpoints, limits, drain), embed (run in a thread), client
(the CLI's admin client). Policy decisions are pure functions in infer_ctl.core.routing.
"""

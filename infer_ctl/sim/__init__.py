"""SGLang-compatible simulated workers (see docs/simulator.md).

Pure pieces (tokenizer, radix cache, timing model, speculative acceptance, engine, rooms, request
runner, metrics text) import no aiohttp so they are unit-testable; the HTTP layer is `server.py` (sockets,
lifecycle, routes) with one module per API (`info_api`, `native_api`, `openai_api`, `bootstrap`), and the
cluster lifecycle is `cluster.py`.
"""

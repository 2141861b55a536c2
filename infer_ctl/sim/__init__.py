"""SGLang-compatible simulated workers (see docs/simulator.md).

Pure pieces (tokenizer, radix cache, timing model, speculative acceptance, metrics text) import no
aiohttp so they are unit-testable; the HTTP layer is `server.py` and the cluster lifecycle `cluster.py`.
"""

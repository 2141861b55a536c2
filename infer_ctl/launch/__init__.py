"""Launching SGLang servers: rendering (render.py), the node-side lifecycle (lifecycle.py) and
readiness/status polling (probe.py)."""

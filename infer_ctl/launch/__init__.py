"""Launching SGLang servers: rendering (render.py), the node-side process control (supervisor.py), who
holds a port (ports.py), the per-node launch lock (lock.py), which servers restart together
(rolling.py), the launch/stop/readiness flows (orchestrate.py, commands.py), HTTP probes (probe.py),
SGLang's own argument parser (argcheck.py) and the router's pool during a rolling restart
(router_hook.py)."""

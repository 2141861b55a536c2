"""The workers as the router sees them: runtime state, pair health, Prometheus metrics, the in-flight load and flights shared by processes."""

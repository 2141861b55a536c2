"""The control plane: the operator's admin API (and the CLI's client for it), active health checks, the named-prefix warmer."""

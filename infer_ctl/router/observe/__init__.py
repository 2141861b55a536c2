"""Observation: tracing, tenants, speculative-decoding statistics, structured logs."""

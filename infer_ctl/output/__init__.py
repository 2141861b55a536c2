"""Renderers: rich tables for terminals, the JSON document for --json, atomic Prometheus textfiles."""

"""Reaching nodes: one Connector protocol (SSH, local) and parallel fan-out over a node selection."""

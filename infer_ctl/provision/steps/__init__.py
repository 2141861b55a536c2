"""Provisioning steps, in the order they run on a node. Each module has one job: probe, plan, act."""

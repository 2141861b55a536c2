"""Sizing math of the field: KV footprint and page alignment, KV tiers, speculative speedup, KV transfer
time, roofline, cost per million tokens.

Formulas and their sources are in docs/sizing.md; every function is exact (integers stay integers).
"""

"""Sizing math of the field: KV footprint, speculative speedup, KV transfer time, roofline.

Formulas and their sources are in docs/sizing.md; every function is exact (integers stay integers).
"""

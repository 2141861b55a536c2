"""Rules: pure functions from gathered facts (+ profile policy) to findings, one stable check id each.

One module per domain (gpu.py, fabric.py, ...). No I/O here: rules are tested table-driven.
"""

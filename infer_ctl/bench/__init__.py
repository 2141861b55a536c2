"""`inferctl bench`: a load generator in the spirit of SGLang's bench_serving (workloads, client, stats)."""

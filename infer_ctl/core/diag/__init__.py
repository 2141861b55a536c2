"""Active diagnostics, run only when asked (never by the default audit): DCGM's `dcgmi diag` (dcgm.py),
GPUDirect RDMA bandwidth with perftest `--use_cuda` (gdr.py) and nccl-tests `all_reduce_perf` (nccl.py).
Fact types and pure judgement; the commands and parsers are in infer_ctl/facts/, the runs in
infer_ctl/checks/diag.py."""

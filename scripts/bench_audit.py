#!/usr/bin/env python3
"""Benchmark: `inferctl audit --only gpu` vs `inferctl exec true` over N real sshd loopback nodes.

Both run as real CLI subprocesses against the same nodes in the same run, so the ratio measures what
the audit adds on top of reaching every node once (its gatherer command, parsing and judging). Each
node gets STAND-IN `nvidia-smi`/`journalctl` executables printing a real 8x H100 capture (no GPUs
here); the node's python3 really runs the gatherer and really fails NVML init, then falls back to
nvidia-smi, exactly as on a node without NVML bindings.

    python scripts/bench_audit.py --nodes 32 --repeats 5      # target: audit <= 2x exec
    python scripts/bench_audit.py --nodes 32 --repeats 3 --baseline /tmp/before
        # also runs the audit of another source tree (e.g. `git archive <commit> | tar -x -C /tmp/before`)
        # interleaved on the same nodes: before/after under the same load
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.sshd_harness import SshCluster, sshd_available  # noqa: E402

FIX = ROOT / "tests" / "fixtures"
XML = FIX / "nvidia-smi-qx" / "k8stestinfra-h100x8-580.105.08.xml"
NVLINK = (FIX / "nvidia-smi-nvlink" / "s-nvgpuexp-h100-80gb-hbm3-590.48.01-18links.txt").read_text()


def prepare(cluster: SshCluster, name: str) -> None:
    bin_dir = cluster.bin_dir(name)
    (bin_dir / "nvlink.txt").write_text("".join(NVLINK.replace("GPU 0:", f"GPU {i}:") for i in range(8)))
    cluster.add_executable(name, "journalctl", ":\n")
    cluster.add_executable(
        name, "nvidia-smi",
        f'case "$1 $2" in\n "-q -x") cat {XML} ;;\n "nvlink -s") cat {bin_dir / "nvlink.txt"} ;;\n *) : ;;\nesac\n',
    )


CPU: dict[str, list[float]] = {}


def timed(argv: list[str], cwd: Path | None = None, label: str = "") -> tuple[float, int]:
    """Wall time of one CLI run; `cwd` runs another tree's infer_ctl (`python -m` looks in cwd first).
    The run's own CPU time (user + sys of inferctl, not of the nodes' sshd) goes to CPU[label]: on a
    machine other jobs load, it moves far less than wall time."""
    env = None if cwd is None else {**os.environ, "PYTHONPATH": str(cwd)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, check=False, cwd=cwd, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if label:
        CPU.setdefault(label, []).append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return wall, proc.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--baseline", type=Path, default=None,
                    help="another source tree whose `audit --only gpu` runs interleaved (before/after)")
    args = ap.parse_args()
    if not sshd_available():
        print("needs /usr/sbin/sshd (Debian openssh-server)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-audit-") as tmp:
        (Path(tmp) / "cluster").mkdir()
        cluster = SshCluster(Path(tmp) / "cluster", args.nodes)
        try:
            for name in cluster.names:
                prepare(cluster, name)
            profile = cluster.write_profile(Path(tmp) / "profile.yaml", gpu={"expected_count": 8},
                                            ssh={"parallelism": args.nodes})
            inferctl = [sys.executable, "-m", "infer_ctl"]
            exec_cmd = [*inferctl, "exec", "-p", str(profile), "--json", "true"]
            audit_cmd = [*inferctl, "audit", "-p", str(profile), "--json", "--only", "gpu"]
            timed(exec_cmd)  # warm caches (imports, page cache) for both alike
            exec_t, audit_t, base_t = [], [], []
            for i in range(args.repeats):  # interleaved so drift hits both equally
                t, rc = timed(exec_cmd, label="exec")
                assert rc == 0, f"exec true failed with {rc}"
                exec_t.append(t)
                # the baseline goes first every other round: neither tree always follows the other
                order = ["audit", "baseline"] if args.baseline is None or i % 2 == 0 else ["baseline", "audit"]
                for which in order:
                    if which == "audit":
                        t, rc = timed(audit_cmd, label="audit")
                        assert rc == 0, f"audit failed with {rc} (expected a healthy fleet)"
                        audit_t.append(t)
                    elif args.baseline is not None:
                        t, rc = timed(audit_cmd, cwd=args.baseline.resolve(), label="baseline")
                        assert rc == 0, f"baseline audit failed with {rc}"
                        base_t.append(t)
        finally:
            cluster.close()
    e, a = statistics.median(exec_t), statistics.median(audit_t)
    print(f"nodes={args.nodes} repeats={args.repeats} load={os.getloadavg()[0]:.1f}")
    cpu = {k: statistics.median(v) for k, v in CPU.items()}
    print(f"inferctl exec true       median {e:.2f} s  (min {min(exec_t):.2f})  inferctl CPU {cpu['exec']:.2f} s")
    print(f"inferctl audit --only gpu median {a:.2f} s  (min {min(audit_t):.2f})  inferctl CPU {cpu['audit']:.2f} s")
    if base_t:
        b = statistics.median(base_t)
        print(f"baseline audit --only gpu median {b:.2f} s  (min {min(base_t):.2f})  inferctl CPU "
              f"{cpu['baseline']:.2f} s  ratio {b / e:.2f}")
    print(f"ratio audit/exec = {a / e:.2f}  (target <= 2.0)")
    return 0 if a / e <= 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())

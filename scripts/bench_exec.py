#!/usr/bin/env python3
"""Benchmark: `inferctl exec` of a trivial command over 32 loopback sshd nodes, against
`ansible all -m command -f 32` (ansible-core) on the same inventory, and against inferctl on 1 node.

Both tools run as fresh processes (what a user types), verify host keys against the same
known_hosts, and log in with the same key. The sshd nodes come from tests/sshd_harness.py and run on
this machine too, so the numbers include the servers' CPU time.

    pip install ansible-core   # the peer; not a test dependency
    python scripts/bench_exec.py [--nodes 32] [--repeat 3] [--breakdown]

--breakdown also splits inferctl's wall time into Python start-up, importing the CLI for `exec`,
loading the profile, connecting to every node (in-process Fleet), and running the command over the
already open connections.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.sshd_harness import SshCluster  # noqa: E402


def timed(argv: list[str], env: dict[str, str] | None = None) -> float:
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
    elapsed = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])}... failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return elapsed


def median_of(repeat: int, argv: list[str], env: dict[str, str] | None = None) -> float:
    return statistics.median(timed(argv, env) for _ in range(repeat))


def breakdown(profile: Path, n: int, repeat: int) -> list[tuple[str, float]]:
    """Where a fresh `inferctl exec` process spends its time (medians of `repeat`)."""
    from infer_ctl.profile import load_profile
    from infer_ctl.remote.base import Command
    from infer_ctl.remote.fleet import Fleet

    bare = median_of(repeat, [sys.executable, "-c", "pass"])
    cli = median_of(repeat, [sys.executable, "-m", "infer_ctl", "exec", "--help"])
    imports = median_of(
        repeat,
        [sys.executable, "-c", "import infer_ctl.cli.main, infer_ctl.cli.exec_cmd, infer_ctl.remote.fleet, "
         "infer_ctl.remote.outcomes, infer_ctl.output.progress"],
    )
    t0 = time.monotonic()
    prof = load_profile(str(profile))
    t_profile = time.monotonic() - t0
    connects, commands = [], []
    for _ in range(repeat):
        with Fleet(prof, parallel=n) as fleet:
            t0 = time.monotonic()
            fleet.map(prof.nodes, lambda c, node: c)  # connect only (TCP, handshake, host key, auth)
            connects.append(time.monotonic() - t0)
            t0 = time.monotonic()
            fleet.map(prof.nodes, lambda c, node: c.run(Command("true")))
            commands.append(time.monotonic() - t0)
    return [
        ("python start-up (python -c pass)", bare),
        ("`inferctl exec --help` (start-up + CLI/typer/rich imports + help)", cli),
        ("start-up + imports an exec run needs (cli, exec, fleet/paramiko, progress)", imports),
        ("load + validate the profile (in-process)", t_profile),
        (f"connect to {n} nodes (in-process Fleet, parallel {n})", statistics.median(connects)),
        (f"run `true` on {n} nodes over the open connections", statistics.median(commands)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--breakdown", action="store_true", help="also split inferctl's time into its parts")
    args = parser.parse_args()
    parts: list[tuple[str, float]] = []
    root = Path(tempfile.mkdtemp(prefix="bench-exec-"))
    cluster = SshCluster(root, args.nodes)
    try:
        profile = cluster.write_profile(root / "profile.yaml")
        inventory = root / "inventory.ini"
        inventory.write_text(
            "[all]\n"
            + "".join(
                f"{n.name} ansible_host={n.host} ansible_port={n.port} ansible_user={cluster.user} "
                f"ansible_ssh_private_key_file={cluster.identity_file}\n"
                for n in cluster.nodes
            )
        )
        env = dict(os.environ)
        env.update(
            ANSIBLE_SSH_ARGS=f"-o UserKnownHostsFile={cluster.known_hosts} -o StrictHostKeyChecking=yes",
            ANSIBLE_PYTHON_INTERPRETER=shutil.which("python3", path="/usr/bin:/usr/local/bin") or "python3",
            ANSIBLE_NOCOLOR="1",
            ANSIBLE_LOCAL_TEMP=str(root / "ansible-tmp"),
        )
        inferctl = [sys.executable, "-m", "infer_ctl", "exec", "-p", str(profile), "--json"]
        ansible = ["ansible", "-i", str(inventory), "-m", "command", "-a", "true"]
        timed([*inferctl, "--", "true"])  # warm the page cache for both
        t_inf_n = median_of(args.repeat, [*inferctl, "--parallel", str(args.nodes), "--", "true"])
        t_inf_1 = median_of(args.repeat, [*inferctl, "--nodes", cluster.nodes[0].name, "--", "true"])
        t_ans_n = median_of(args.repeat, [*ansible, "all", "-f", str(args.nodes)], env)
        t_ans_1 = median_of(args.repeat, [*ansible, cluster.nodes[0].name], env)
        if args.breakdown:
            parts = breakdown(profile, args.nodes, args.repeat)
    finally:
        cluster.close()
        shutil.rmtree(root, ignore_errors=True)
    n = args.nodes
    print(f"median of {args.repeat} runs, {os.cpu_count()} CPUs, sshd nodes on the same machine")
    print(f"| tool | 1 node (s) | {n} nodes (s) | per extra node (ms) |")
    print("|---|---|---|---|")
    print(f"| inferctl exec | {t_inf_1:.2f} | {t_inf_n:.2f} | {(t_inf_n - t_inf_1) / (n - 1) * 1000:.0f} |")
    print(f"| ansible -m command -f {n} | {t_ans_1:.2f} | {t_ans_n:.2f} | {(t_ans_n - t_ans_1) / (n - 1) * 1000:.0f} |")
    print(f"ratio ansible/inferctl on {n} nodes: {t_ans_n / t_inf_n:.1f}x (target >= 8x)")
    print(f"inferctl {n} nodes vs 1 node: {t_inf_n / t_inf_1:.2f}x")
    if parts:
        print("\n| part of a fresh `inferctl exec` run | median (s) |\n|---|---|")
        for label, seconds in parts:
            print(f"| {label} | {seconds:.2f} |")


if __name__ == "__main__":
    main()

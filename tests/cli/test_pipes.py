"""Every table-printing command, piped: its stdout goes through a real pipe (a
subprocess, as `inferctl ... | cat` would), and must hold no box drawing, no terminal escapes, no trailing
blanks and no line cut at a pretend 80-column width. The commands run here need no remote node: the
shipped local profile (connection: local), the sizing math, and a router in front of simulated workers."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from infer_ctl.output.console import make_consoles
from infer_ctl.router.daemon.embed import RouterHandle, router_config, start_router_in_thread
from infer_ctl.sim.cluster import ThreadedSimCluster, WorkerSpec, start_cluster_in_thread

BOX = re.compile("[\u2500-\u259f]")
LOCAL = ["-p", "builtin:local"]

LOCAL_COMMANDS = [
    ["plan", "kv", "-m", "llama-3.1-70b", "--hbm-gb", "640"],
    ["plan", "kv", "--list-presets"],
    ["plan", "spec", "--table"],
    ["plan", "transfer", "-m", "llama-3.1-70b", "--prompt-tokens", "8192", "--bandwidth-gbps", "400"],
    ["plan", "roofline", "-m", "llama-3.1-70b", "-x", "h200", "--gpus", "8"],
    ["plan", "tiers", "-m", "llama-3.1-70b"],
    ["plan", "cost"],
    ["provision", "steps"],
    ["profile", "validate", *LOCAL],
    ["nodes", *LOCAL],
    ["exec", *LOCAL, "--", "head -3 /etc/os-release"],
    ["status", *LOCAL],
    ["launch", "--dry-run", *LOCAL],
    ["check", "servers", *LOCAL],
    ["router", "tenant-key"],
]


def piped(*argv: str) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR", "TTY_COMPATIBLE")}
    env["PYTHONPATH"] = os.getcwd()
    # capture_output: stdout is a pipe, as in `inferctl ... | cat`
    proc = subprocess.run([sys.executable, "-m", "infer_ctl", *argv], capture_output=True, text=True, timeout=120,
                          env=env, check=False)
    assert proc.returncode in (0, 1, 2, 3), proc.stderr
    return proc.returncode, proc.stdout


def assert_plain(out: str) -> None:
    assert out.strip()
    assert not BOX.search(out), out
    assert "\x1b" not in out, out
    assert not [line for line in out.split("\n") if line != line.rstrip()], out


@pytest.mark.parametrize("argv", LOCAL_COMMANDS, ids=" ".join)
def test_local_command_piped_is_plain_text(argv: list[str]) -> None:
    _, out = piped(*argv)
    assert_plain(out)


def test_wide_rows_are_not_wrapped_at_80_columns() -> None:
    # at a pretend 80 columns the status table cut its headers to "disaggr…" and folded rows
    _, out = piped("status", *LOCAL)
    header = next(line for line in out.split("\n") if line.startswith("instance"))
    assert "disaggregation_mode" in header and "cache_hit_rate" in header
    assert len(header) > 80


def test_exec_piped_is_pdsh_style_with_identical_outputs_grouped() -> None:
    code, out = piped("exec", *LOCAL, "--", "echo same; hostname >/dev/null")
    assert code == 0
    assert out.split("\n")[:2] == ["pf-01,pf-02,dc-01,dc-02: same", "4/4 ok"]
    _, out = piped("exec", *LOCAL, "--nodes", "pf-01,dc-01", "--", "echo $INFERCTL_NODE_NAME-$$")
    assert re.match(r"^pf-01: \S+\ndc-01: \S+\n2/2 ok\n$", out), out


@pytest.fixture(scope="module")
def router() -> Iterator[RouterHandle]:
    cluster: ThreadedSimCluster = start_cluster_in_thread([WorkerSpec("mixed", time_scale=0.01)])
    try:
        with start_router_in_thread(router_config(workers=cluster.urls, warm_via="pair")) as handle:
            yield handle
    finally:
        cluster.stop()


@pytest.mark.parametrize("verb", [["status"], ["workers"], ["spec"], ["prefixes", "list"], ["tenants"]], ids=" ".join)
def test_router_command_piped_is_plain_text(router: RouterHandle, verb: list[str]) -> None:
    _, out = piped("router", *verb, "--url", router.url)
    assert_plain(out)


def test_bench_piped_is_plain_text(router: RouterHandle) -> None:
    _, out = piped("bench", "--url", router.url, "--requests", "4", "-c", "2", "--max-new-tokens", "4")
    assert_plain(out)



def test_stderr_redirected_keeps_each_line_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    # progress to a log file: `demo 2>demo.log` folded "prefill \nhttp://..." at a pretend 80 columns
    monkeypatch.delenv("COLUMNS", raising=False)
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    _, err = make_consoles()
    line = "demo: started 4 simulated workers: " + ", ".join(f"prefill http://127.0.0.{i}:30000" for i in range(4))
    err.print(f"[dim]{line}[/dim]")
    assert log.getvalue() == line + "\n"

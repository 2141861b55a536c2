"""launch / status / check servers / drift / logs / stop end to end, over real sshd.

Real: OpenSSH servers on loopback (tests/sshd_harness.py), the SSH connector and Fleet, the shell
commands that write files and start/stop processes, HTTP between controller and servers, TCP connects
from the decode node to the prefill's bootstrap port. Stand-in: `<venv>/0.5.23/bin/python` is
tests/launch/standin_sglang.py, which starts an inferctl simulated worker instead of SGLang (no GPUs).
The nodes have no systemd, so the managed-process supervisor (pid file + log file) is what runs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from infer_ctl.cli.main import main
from tests.launch.test_logs_terminal import HOSTILE, SHOWN, logs_on_a_tty
from tests.sshd_harness import free_port

pytest.importorskip("infer_ctl.sim.server", reason="the simulator (infer_ctl.sim) is not available")
pytestmark = [pytest.mark.ssh, pytest.mark.slow]

STANDIN = Path(__file__).with_name("standin_sglang.py")


def _install_standin(venv: Path) -> None:
    py = venv / "0.5.23" / "bin" / "python"
    py.parent.mkdir(parents=True)
    py.write_text(f'#!/bin/sh\n# STAND-IN for SGLang (see {STANDIN.name})\nexec {sys.executable} {STANDIN} "$@"\n')
    py.chmod(0o755)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    doc = json.loads(out) if "--json" in argv else out
    return code, doc, err


@pytest.fixture
def cluster_profile(ssh_cluster: Any, tmp_path: Path) -> tuple[Any, Path, dict[str, Any]]:
    cluster = ssh_cluster(2, names=["pf-01", "dc-01"], roles=[["prefill"], ["decode"]])
    model = tmp_path / "models" / "Llama-3.1-70B-Instruct"
    model.mkdir(parents=True)
    _install_standin(tmp_path / "venvs")
    host = cluster.node("pf-01").host
    data = cluster.profile_data(
        models={
            "target": {"path": str(model), "tp": 8},
            "draft": {"path": str(model) + "-eagle3", "algorithm": "EAGLE3", "num_steps": 3, "eagle_topk": 1,
                      "num_draft_tokens": 4},
        },
        sglang={
            "venv": str(tmp_path / "venvs"),
            "log_dir": str(tmp_path / "{node}" / "log"),
            "prefill": {"port": free_port(host), "bootstrap_port": free_port(host)},
            "decode": {"port": free_port(cluster.node("dc-01").host)},
            # an EAGLE decode without it is capped at 48 by SGLang (launch.spec WARN)
            "extra_args": {"decode": ["--max-running-requests", "128"]},
            "lifecycle": {"config_dir": str(tmp_path / "{node}" / "etc"), "start_timeout_s": 40,
                          "stop_timeout_s": 10},
        },
    )  # fmt: skip
    path = tmp_path / "profile.yaml"
    _write(path, data)
    return cluster, path, data


def _write(path: Path, data: dict[str, Any]) -> None:
    import yaml

    path.write_text(yaml.safe_dump(data, sort_keys=False))


def test_launch_status_drift_logs_stop(cluster_profile: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _cluster, prof, data = cluster_profile
    p = str(prof)
    try:
        code, doc, err = _run(capsys, "launch", "-p", p, "--json")
        assert code == 0, (doc, err)
        rows = {r["instance"]: r for r in doc["results"]}
        assert {n: (r["action"], r["state"], r["supervisor"]) for n, r in rows.items()} == {
            "pf-01-prefill": ("started", "ready", "process"),
            "dc-01-decode": ("started", "ready", "process"),
        }
        env = (tmp_path / "pf-01" / "etc" / "sglang-prefill.env").read_text()
        assert "SGLANG_HOST_IP=" in env and "HF_HUB_OFFLINE=1" in env

        # safe to run twice: nothing changed, nothing restarts
        code, doc, _ = _run(capsys, "launch", "-p", p, "--json")
        assert code == 0 and {r["action"] for r in doc["results"]} == {"unchanged"}

        code, doc, _ = _run(capsys, "status", "-p", p, "--json")
        assert code == 0, doc
        st = {r["instance"]: r for r in doc["results"]}
        assert st["pf-01-prefill"]["process"] == "running" and st["pf-01-prefill"]["health"] == "ok"
        assert st["dc-01-decode"]["disaggregation_mode"] == "decode"
        assert st["dc-01-decode"]["speculative_algorithm"] == "EAGLE3"
        assert st["pf-01-prefill"]["model"] == data["models"]["target"]["path"]

        code, doc, _ = _run(capsys, "check", "servers", "-p", p, "--json")
        checks = {(f["check"], f["subject"]): f["status"] for f in doc["findings"]}
        assert code == 0, doc["findings"]
        assert checks[("servers.drift", "dc-01-decode")] == "ok"
        bootstrap = [f for f in doc["findings"] if f["check"] == "servers.bootstrap"]
        assert [f["status"] for f in bootstrap] == ["ok"]

        # drift: the profile changes, the running servers do not
        data["models"]["draft"].update(num_steps=4, num_draft_tokens=5)
        _write(prof, data)
        code, doc, _ = _run(capsys, "check", "servers", "-p", p, "--json")
        assert code == 2
        drift = [f for f in doc["findings"] if f["check"] == "servers.drift" and f["status"] == "fail"]
        assert {(f["subject"], f["details"]["setting"]) for f in drift} >= {
            ("pf-01-prefill", "speculative_num_steps"),
            ("dc-01-decode", "speculative_num_draft_tokens"),
        }
        assert "speculative_num_steps is 3 but the profile says 4" in {f["message"] for f in drift}

        # relaunching applies the change: both files changed, both restart
        code, doc, _ = _run(capsys, "launch", "-p", p, "--json", "--role", "decode")
        assert code == 0 and doc["results"][0]["action"] == "restarted"

        # rolling restart with the router running: the decode leaves its pool before the restart and
        # comes back once healthy (real router, admin API on loopback)
        from infer_ctl.router.control.client import AdminClient
        from infer_ctl.router.daemon.embed import router_config, start_router_in_thread

        urls = {r["instance"]: r["url"] for r in st.values()}
        boot = data["sglang"]["prefill"]["bootstrap_port"]
        handle = start_router_in_thread(
            router_config(prefill=[(urls["pf-01-prefill"], boot)], decode=[urls["dc-01-decode"]])
        )
        try:
            data["router"] = {"listen": handle.url.removeprefix("http://")}
            _write(prof, data)
            code, doc, _ = _run(capsys, "launch", "-p", p, "--json", "--rolling")
            assert code == 0, doc
            rows = {r["instance"]: r for r in doc["results"]}
            assert rows["dc-01-decode"]["action"] == "restarted"
            assert rows["dc-01-decode"]["router"] == "removed from the router; re-added to the router"
            workers = AdminClient(handle.url).call("GET", "/admin/workers")["workers"]
            assert {(w["url"], w["role"]) for w in workers} == {
                (urls["pf-01-prefill"], "prefill"),
                (urls["dc-01-decode"], "decode"),
            }
        finally:
            handle.stop(drain=False)

        code, out, _ = _run(capsys, "logs", "dc-01-decode", "-p", p, "--lines", "50")
        assert code == 0 and "standin sglang decode ready" in out and "inferctl: starting" in out
        # a log line with terminal control sequences: piped, `logs` writes it exactly; to a terminal,
        # as escapes (tests/launch/test_logs_terminal.py)
        with (tmp_path / "dc-01" / "log" / "sglang-decode.log").open("a", encoding="utf-8") as log:
            log.write(HOSTILE)
        code, out, _ = _run(capsys, "logs", "dc-01-decode", "-p", p, "--lines", "50")
        assert code == 0 and HOSTILE in out
        on_tty = logs_on_a_tty("dc-01-decode", "-p", p, "--lines", "50")
        assert SHOWN in on_tty and "standin sglang decode ready" in on_tty and "\x1b" not in on_tty
        code, _, err = _run(capsys, "logs", "dc-01-decode", "-p", p, "--since", "10m")
        assert code == 64 and "--since needs the systemd journal" in err
    finally:
        code, doc, _ = _run(capsys, "stop", "-p", p, "--json")
    assert code == 0, doc
    assert [(r["instance"], r["result"]) for r in doc["results"]] == [
        ("dc-01-decode", "stopped"),  # decodes first
        ("pf-01-prefill", "stopped"),
    ]
    code, doc, _ = _run(capsys, "status", "-p", p, "--json")
    assert code == 2 and {r["process"] for r in doc["results"]} == {"stopped"}
    code, doc, _ = _run(capsys, "stop", "-p", p, "--json")  # twice is fine
    assert code == 0 and {r["result"] for r in doc["results"]} == {"not-running"}


def test_worker_that_fails_to_start_shows_its_log_tail(
    cluster_profile: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    _cluster, prof, data = cluster_profile
    data["models"]["target"]["path"] = "/nonexistent/model"
    _write(prof, data)
    try:
        code, out, _ = _run(capsys, "launch", "-p", str(prof), "--nodes", "dc-01", "--timeout", "20")
        assert code == 2
        assert "the server process exited (dead) before it became healthy" in out
        assert "OSError: model path /nonexistent/model is not a directory" in out  # the log tail
    finally:
        _run(capsys, "stop", "-p", str(prof), "--json")

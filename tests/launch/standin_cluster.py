"""Helpers for the launch tests on real sshd nodes with the stand-in SGLang (standin_sglang.py): install
the stand-in as `<venv>/0.5.23/bin/python`, build a PD profile for a harness cluster, run the CLI, and
look at the server processes a node runs (from /proc, as an operator would with ps)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from infer_ctl.cli.main import main
from tests.sshd_harness import free_port

STANDIN = Path(__file__).with_name("standin_sglang.py")


def install_standin(venv: Path) -> None:
    py = venv / "0.5.23" / "bin" / "python"
    py.parent.mkdir(parents=True, exist_ok=True)
    py.write_text(f'#!/bin/sh\n# STAND-IN for SGLang (see {STANDIN.name})\nexec {sys.executable} {STANDIN} "$@"\n')
    py.chmod(0o755)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    doc = json.loads(out) if "--json" in argv else out
    return code, doc, err


def write_yaml(path: Path, data: dict[str, Any]) -> None:
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def pd_profile(
    cluster: Any, tmp_path: Path, *, gpus: int = 0, models: dict[str, Any] | None = None, **sglang: Any
) -> tuple[Path, dict[str, Any]]:
    """A PD profile over every node of `cluster`, each node with its own free ports (overrides), the
    stand-in installed as the venv's python, files and logs under tmp_path/<node>/."""
    model = tmp_path / "models" / "Llama-3.1-70B-Instruct"
    model.mkdir(parents=True, exist_ok=True)
    install_standin(tmp_path / "venvs")
    data = cluster.profile_data(
        models=models or {"target": {"path": str(model), "tp": 8}},
        sglang={
            "venv": str(tmp_path / "venvs"),
            "log_dir": str(tmp_path / "{node}" / "log"),
            "lifecycle": {"config_dir": str(tmp_path / "{node}" / "etc"), "start_timeout_s": 40,
                          "stop_timeout_s": 10},
            **sglang,
        },
    )  # fmt: skip
    # nothing listens here unless a test starts a router: never another test's router on a default port
    data["router"] = {"listen": f"127.0.0.1:{free_port('127.0.0.1')}"}
    for node in data["nodes"]:
        ov: dict[str, Any] = node.setdefault("overrides", {})
        if "prefill" in node["roles"]:
            ov.update(prefill_port=free_port(node["host"]), bootstrap_port=free_port(node["host"]))
        if "decode" in node["roles"]:
            ov["decode_port"] = free_port(node["host"])
        if gpus:
            node["gpus"] = gpus
    path = tmp_path / "profile.yaml"
    write_yaml(path, data)
    return path, data


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def standin_servers(port: int) -> list[int]:
    """Pids of every live stand-in SGLang server started with `--port PORT` (the harness nodes are this
    machine, so /proc shows them all). Zombies do not count."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        cmd = _cmdline(pid)
        if "sglang.launch_server" in cmd and f" --port {port} " in cmd + " ":
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
            except OSError:
                continue
            if state != "Z":
                pids.append(int(pid))
    return sorted(pids)

"""Drift, flag by flag (core/sglang/settings.py, judge.py) and the deployed-vs-running judgement
(core/sglang/deployed.py), pure: no hosts needed."""

from __future__ import annotations

import pytest

from infer_ctl.core.sglang import find_instance
from infer_ctl.core.sglang.deployed import (
    RunningServer,
    deployed_argv,
    judge_files,
    judge_restart_pending,
    parse_env_file,
    systemd_unquote,
)
from infer_ctl.core.sglang.judge import expected_server_args, judge_drift, judge_env_drift
from infer_ctl.core.sglang.settings import canonical_value, command_settings
from infer_ctl.launch.render import render_argv, systemd_quote
from infer_ctl.profile.load import validate_profile_data

PROFILE = validate_profile_data({
    "name": "t",
    "nodes": [{"name": "pf-01", "host": "10.0.0.11", "roles": ["prefill"], "rdma": {"devices": ["mlx5_0"], "gid_index": 3}},
              {"name": "dc-01", "host": "10.0.0.21", "roles": ["decode"]}],
    "models": {"target": {"path": "/m", "tp": 8}},
    "sglang": {"extra_args": {"prefill": ["--chunked-prefill-size", "8192", "--cuda-graph-bs", "1", "2", "4"]}},
})  # fmt: skip
PRE = find_instance(PROFILE, "pf-01-prefill")


def test_command_settings_read_flags_as_argparse_does() -> None:
    got = command_settings(["--tp", "4", "--tp-size=8", "--enable-metrics", "--cuda-graph-bs", "1", "2",
                            "--no-enable-dynamic-batch-tokenizer", "--model", "/m"])  # fmt: skip
    assert got["--tp-size"] == "8"  # the last occurrence wins, alias or not
    assert got["--enable-metrics"] == "True" and got["--cuda-graph-bs"] == "1 2"
    assert got["--model-path"] == "/m"


@pytest.mark.parametrize(("key", "a", "b"), [
    ("tp_size", "8", 8), ("mem_fraction_static", "0.85", 0.85), ("enable_metrics", "True", True),
    ("speculative_algorithm", "NEXTN", "EAGLE"), ("disaggregation_transfer_backend", "mooncake_tcp", "mooncake"),
    ("kv_events_config", '{"publisher":"zmq","topic":"a"}', '{"topic": "a", "publisher": "zmq"}'),
    ("cuda_graph_bs", "1 2 4", [1, 2, 4]), ("disaggregation_ib_device", "mlx5_0,mlx5_0,mlx5_1", "mlx5_0,mlx5_1"),
])  # fmt: skip
def test_one_spelling_for_a_command_line_value_and_sglangs_resolved_one(key: str, a: str, b: object) -> None:
    assert canonical_value(key, a) == canonical_value(key, b)


def test_drift_compares_every_flag_of_the_launch_command() -> None:
    argv = render_argv(PROFILE, PRE)
    args = argv[argv.index("sglang.launch_server") + 1 :]
    expected = expected_server_args(PRE, argv)
    same = {"launch_command": " ".join(args)}
    [ok] = judge_drift(PRE, expected, same, launch_args=args)
    assert ok.status.value == "ok" and f"({len(command_settings(args))} compared, from /server_info launch_command)" in ok.message
    # what the 16 keys of the old check never saw: the HCA list, an extra arg, a flag only the server has
    running = " ".join(args).replace("--disaggregation-ib-device mlx5_0", "--disaggregation-ib-device mlx5_1")
    running = running.replace("--chunked-prefill-size 8192", "--chunked-prefill-size 4096") + " --enable-mixed-chunk"
    found = {f.details["setting"]: f.message for f in judge_drift(PRE, expected, {"launch_command": running}, launch_args=args)}
    assert found == {
        "disaggregation_ib_device": "disaggregation_ib_device is mlx5_1 but the profile says mlx5_0",
        "chunked_prefill_size": "chunked_prefill_size is 4096 but the profile says 8192",
        "enable_mixed_chunk": "enable_mixed_chunk is True on the running server but the profile does not set it",
    }


def test_without_an_sglang_launch_command_every_flag_is_compared_with_the_resolved_value() -> None:
    argv = render_argv(PROFILE, PRE)
    expected = expected_server_args(PRE, argv)
    assert expected["chunked_prefill_size"] == "8192" and expected["cuda_graph_bs"] == "1 2 4"
    # a simulated worker names its own command line: the resolved values are compared instead
    info = {"launch_command": "inferctl sim serve --role prefill", "model_path": "/m", "chunked_prefill_size": 4096,
            "cuda_graph_bs": [1, 2, 4], "enable_metrics": True}  # fmt: skip
    [fail] = judge_drift(PRE, expected, info, launch_args=argv[3:])
    assert (fail.details["setting"], fail.details["source"]) == ("chunked_prefill_size", "server_args")


def test_env_drift_names_each_variable() -> None:
    [f] = judge_env_drift(PRE, {"MC_GID_INDEX": "5", "HF_HUB_OFFLINE": "1"}, {"MC_GID_INDEX": "3", "HF_HUB_OFFLINE": "1"})
    assert (f.status.value, f.message) == ("fail", "env MC_GID_INDEX is 3 but the profile says 5")


@pytest.mark.parametrize("word", ['{"0":"mlx5_0","1":"mlx5_1"}', "a $b 100%", "/m/x", 'x "y" \\z', "$$"])
def test_systemd_unquote_reads_what_systemd_quote_writes(word: str) -> None:
    assert systemd_unquote(" ".join(["/py", systemd_quote(word), "--x"])) == ["/py", word, "--x"]


def test_deployed_argv_from_a_unit_or_a_run_script() -> None:
    assert deployed_argv('[Service]\nExecStart=/py -m sglang.launch_server --kv "{\\"a\\": 1}"\n') == [
        "/py", "-m", "sglang.launch_server", "--kv", '{"a": 1}']  # fmt: skip
    assert deployed_argv("#!/bin/sh\nexec /py -m sglang.launch_server --host '1 2'\n") == [
        "/py", "-m", "sglang.launch_server", "--host", "1 2"]  # fmt: skip
    assert parse_env_file("# c\nA=1\nB='x y'\n") == {"A": "1", "B": "x y"}


def test_files_and_restart_pending() -> None:
    env, run = "/etc/inferctl/sglang-prefill.env", "/etc/inferctl/sglang-prefill.run"
    rendered = [(env, "A=1\nMC_GID_INDEX=5\n"), (run, "#!/bin/sh\nexec /py -m sglang.launch_server --port 1\n")]
    [ok] = judge_files(PRE, rendered, dict(rendered))
    assert ok.status.value == "ok"
    [missing, differs] = judge_files(PRE, rendered, {run: "#!/bin/sh\nexec /py -m sglang.launch_server --port 2\n"})
    assert "sglang-prefill.env missing on the node" in missing.message
    assert "differs (line 2: 'exec /py -m sglang.launch_server --port 2' on the node" in differs.message
    running = RunningServer(42, ["/usr/bin/python3", "standin.py", "-m", "sglang.launch_server", "--port", "1"],
                            {"A": "1", "MC_GID_INDEX": "3", "PATH": "/bin"})  # fmt: skip
    [pending] = judge_restart_pending(PRE, env, rendered[0][1], run, rendered[1][1], running)
    assert pending.status.value == "warn"
    assert pending.message == (f"restart pending: pid 42 started before its files changed: {env} sets MC_GID_INDEX=5, "
                               "the server runs with MC_GID_INDEX=3")  # fmt: skip
    current = RunningServer(42, running.argv, {"A": "1", "MC_GID_INDEX": "5"})
    [fine] = judge_restart_pending(PRE, env, rendered[0][1], run, rendered[1][1], current)
    assert (fine.status.value, fine.message) == ("ok", "pid 42 runs what is deployed")
    blind = RunningServer(42, ["/py", "-m", "sglang.launch_server", "--port", "3"], None)
    [stale] = judge_restart_pending(PRE, env, rendered[0][1], run, rendered[1][1], blind)
    assert "gives --port 1, the server runs with 3" in stale.message

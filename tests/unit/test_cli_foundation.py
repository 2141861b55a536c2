"""The CLI contract: version, help of every command, exit codes, JSON on stdout only."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from infer_ctl import __version__
from infer_ctl.cli.main import VERBS, build_app, main


def _commands(group=None, prefix=()):  # type: ignore[no-untyped-def]
    import typer.main

    cmd = typer.main.get_command(build_app()) if group is None else group
    yield prefix
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _commands(sub, (*prefix, name))


ALL_COMMANDS = sorted(set(_commands()))


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"inferctl {__version__}"


def test_python_dash_m_works() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "infer_ctl", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == f"inferctl {__version__}"


@pytest.mark.parametrize("command", ALL_COMMANDS, ids=lambda c: " ".join(c) or "(root)")
def test_every_help_is_clean(command: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*command, "--help"]) == 0
    captured = capsys.readouterr()
    assert "Usage:" in captured.out and "Traceback" not in captured.out + captured.err


def test_unknown_command_and_bad_option_exit_64(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["no-such-command"]) == 64
    assert main(["plan", "kv", "--context", "abc"]) == 64
    assert "Traceback" not in capsys.readouterr().err


def test_invalid_profile_one_line_exit_64(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nnodes:\n  - {name: a, host: h, roles: [prefil]}\n")
    assert main(["profile", "validate", "-p", str(bad)]) == 64
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"inferctl: error: {bad}: nodes[0].roles[0]: 'prefil' is not one of prefill, decode "
        "(did you mean 'prefill'?)"
    ]


def test_validate_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "validate", "-p", "builtin:local", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (
        doc["command"] == "profile validate"
        and doc["status"] == "ok"
        and doc["roles"] == {"prefill": 2, "decode": 2}
    )


def test_validate_json_on_invalid_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nnodes:\n  - {name: a, host: h, roles: [prefill], gpus: -1}\n")
    assert main(["profile", "validate", "-p", str(bad), "--json"]) == 64
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit_code"] == 64 and doc["status"] == "fail"
    messages = [f["message"] for f in doc["findings"]]
    assert any(m.startswith("nodes[0].gpus:") for m in messages)


def test_profile_show_json_fills_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "show", "-p", "builtin:local", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # the standard envelope, the profile with its defaults under "resolved"
    assert (doc["command"], doc["profile"], doc["status"], doc["exit_code"]) == ("profile show", "local", "ok", 0)
    assert doc["path"].endswith("local.yaml")
    assert doc["resolved"]["sglang"]["prefill"]["bootstrap_port"] == 8998
    assert doc["resolved"]["ssh"]["host_key_policy"] == "reject"


@pytest.mark.parametrize(
    ("argv", "key", "value"),
    [
        (["plan", "kv", "-m", "llama-3.1-70b", "--context", "8192"], "kv_bytes", 2_684_354_560),
        (
            ["plan", "kv", "--layers", "80", "--kv-heads", "8", "--head-dim", "128", "--dtype", "fp8"],
            "kv_bytes_per_token",
            163_840,
        ),
        (
            ["plan", "spec", "--alpha", "0.8", "--gamma", "4", "--cost-ratio", "0.05"],
            "expected_tokens",
            3.3616,
        ),
        (
            ["plan", "transfer", "--bytes", "2684354560", "--bandwidth-gbps", "400", "--latency-us", "5"],
            "seconds",
            0.0536920912,
        ),
        (
            ["plan", "transfer", "-m", "llama-3.1-70b", "--prompt-tokens", "8192", "--latency-us", "5"],
            "bytes",
            2_684_354_560,
        ),
        (["plan", "roofline", "-m", "llama-3.1-8b", "-x", "h200"], "bound", "bandwidth"),
    ],
)
def test_plan_json(argv: list[str], key: str, value: object, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc[key] == (pytest.approx(value) if isinstance(value, float) else value)


def test_plan_spec_table_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "spec", "--table", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["table"]["speedup"]) == len(doc["table"]["alphas"])


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "spec", "--alpha", "1.5"],
        ["plan", "kv"],
        ["plan", "kv", "-m", "gpt-17"],
        ["plan", "kv", "-m", "llama-3.1-8b", "--dtype", "fp4x"],
        ["plan", "transfer"],
        ["plan", "transfer", "--bytes", "10", "--bandwidth-gbps", "0"],
        ["plan", "roofline", "-x", "tpu-v9", "-m", "llama-3.1-8b"],
    ],
)
def test_plan_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 64
    err = capsys.readouterr().err
    assert err.startswith("inferctl: error: ") and "Traceback" not in err


def test_only_the_requested_verb_is_imported() -> None:
    """`inferctl exec` must not pay for the router, the simulator or the tokenizer libraries."""
    code = (
        "import sys\n"
        "from infer_ctl.cli.main import build_app\n"
        "build_app(['plan', 'kv'])\n"
        "loaded = [m for m in ('infer_ctl.cli.router_cmd', 'infer_ctl.cli.sim_cmd', 'infer_ctl.cli.exec_cmd',"
        " 'paramiko', 'aiohttp', 'tokenizers') if m in sys.modules]\n"
        "print(','.join(loaded))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == ""


def test_every_verb_is_listed_in_root_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for verb in [*VERBS, "status", "stop", "logs"]:
        assert verb in out


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["plan", "kv", "--json"], "plan kv"),
        (["profile", "show", "-p", "/nonexistent.yaml", "--json"], "profile show"),
        (["plan", "spec", "--alpha", "x", "--json"], "plan spec"),
    ],
)
def test_errors_in_json_mode_still_print_one_document(
    argv: list[str], command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 64
    doc = json.loads(capsys.readouterr().out)
    assert doc["command"] == command and doc["exit_code"] == 64 and doc["status"] == "fail"
    assert doc["error"]["message"]


def test_unknown_key_without_close_match_lists_the_valid_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "p.yaml"
    bad.write_text("name: x\nnodes:\n  - {name: a, host: h, roles: [prefill], zzz: 1}\n")
    assert main(["profile", "validate", "-p", str(bad)]) == 64
    assert "nodes[0].zzz: unknown key 'zzz' (valid keys: name, host, port," in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["profile", "validate", "-p", "EMPTY"], "hint: start from profiles/local.yaml"),
        (
            ["profile", "show", "-p", "/nonexistent.yaml"],
            "hint: check the path, or try --profile builtin:local",
        ),
        (["plan", "transfer"], "hint: e.g. inferctl plan transfer --model llama-3.1-70b"),
        (["plan", "roofline", "--accelerator", "h200"], "hint: e.g. --model llama-3.1-70b"),
    ],
)
def test_error_lines_come_with_a_hint(
    argv: list[str], hint: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert main([str(empty) if a == "EMPTY" else a for a in argv]) == 64
    err = capsys.readouterr().err.splitlines()
    assert (err[0].startswith("inferctl: error: ") and err[1].strip() == hint) or err[1].strip().startswith(
        hint
    )

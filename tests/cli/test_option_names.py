"""One meaning per short option letter and per long option name across the whole CLI:
a user who learnt `-n` on `exec` must not get something else from `-n` on `bench`."""

from __future__ import annotations

from collections import defaultdict

import pytest

from infer_ctl.cli.main import main
from tests.cli.tree import commands, options

#: Long names used by several commands whose help is worded per command; each has ONE meaning, written
#: here. A new shared name with differing help fails the test until its one meaning is stated (or it is
#: renamed): that is the review point.
ONE_MEANING = {
    "--advise": "only advise, whatever the profile's control setting says (speculative.control, pd.control)",
    "--profile": "the cluster profile (-p, $INFERCTL_PROFILE)",
    "--role": "a PD role: prefill, decode, mixed/collocated (filters nodes, or names a worker's role)",
    "--url": "the HTTP address inferctl talks to (a router, or for bench any SGLang-compatible server)",
    "--prefill": "the prefill workers (sim serve: how many to start; router serve: their URLs; profile init: "
    "their nodes)",
    "--decode": "the decode workers (sim serve: how many to start; router serve: their URLs; profile init: "
    "their nodes)",
    "--mixed": "the mixed (non-PD) workers (sim serve: how many to start; router serve: their URLs; profile "
    "init: their nodes)",
    "--model": "a model preset of the sizing math (plan --list-presets)",
    "--accelerator": "a GPU preset of the sizing math",
    "--batch": "concurrent sequences per decode step",
    "--concurrency": "requests / sessions in flight at once",
    "--context": "tokens of one sequence",
    "--hbm-gb": "HBM in GB",
    "--hicache-ratio": "HiCache host pool / HBM pool",
    "--hicache-size": "HiCache host pool per rank in GB",
    "--history": "the audit history file (JSON lines)",
    "--kv-dtype": "KV cache dtype",
    "--mem-fraction": "SGLang's --mem-fraction-static",
    "--no-spec": "speculative decoding off",
    "--out": "where the command writes its artefact",
    "--page-size": "SGLang's --page-size",
    "--params-b": "parameters in billions",
    "--pingpong": "also run the RDMA pair tests",
    "--pip-arg": "an extra pip argument",
    "--prompt-tokens": "prompt tokens per request",
    "--requests": "how many requests the workload sends",
    "--scenario": "which of the command's named scenarios",
    "--seed": "the random seed",
    "--spec-alpha": "speculative acceptance rate",
    "--tflops": "peak dense FP16/BF16 TFLOPS",
    "--time-scale": "wall seconds per model second",
    "--timeout": "seconds before giving up",
    "--tp": "tensor-parallel ranks",
    "--weight-dtype": "weight dtype",
    "--weights-gb": "weights in GB",
    "--parallel": "at most N nodes at once",
    "--gpus": "a number of GPUs (plan roofline: one replica's; plan pd: the pool split; profile init: a node's)",
    "--rate": "arrivals per second (requests/s)",
    "--output-tokens": "output tokens per request",
    "--decode-efficiency": "achieved / roofline decode tokens/s",
    "--bandwidth-gbps": "link rate of one NIC in Gb/s",
    "--links": "NICs a transfer stripes over",
    "--latency-us": "fabric latency in microseconds",
    "--name": "the name of the thing the command makes or acts on",
    "--user": "a login name",
    "--force": "replace what exists",
}


def _uses() -> tuple[dict[str, set[str]], dict[str, list[tuple[str, object]]]]:
    short_to_long: dict[str, set[str]] = defaultdict(set)
    long_uses: dict[str, list[tuple[str, object]]] = defaultdict(list)
    for path, cmd in commands():
        for opt in options(cmd):
            names = [*opt.opts, *opt.secondary_opts]
            longs = [n for n in names if n.startswith("--")]
            for n in names:
                if not n.startswith("--"):
                    short_to_long[n].add(longs[0] if longs else n)
            for n in longs:
                long_uses[n].append((path, (opt.is_flag, opt.help)))
    return short_to_long, long_uses


def test_every_short_letter_has_one_long_name() -> None:
    short_to_long, _ = _uses()
    clashes = {s: sorted(longs) for s, longs in short_to_long.items() if len(longs) > 1}
    assert clashes == {}


def test_every_long_name_has_one_meaning() -> None:
    _, long_uses = _uses()
    clashes = {}
    for name, uses in long_uses.items():
        kinds = {flag for _, (flag, _) in uses}
        helps = {h for _, (_, h) in uses}
        if len(kinds) > 1 or (len(helps) > 1 and name not in ONE_MEANING):
            clashes[name] = sorted(f"{path}: {h}" for path, (_, h) in uses)
    assert clashes == {}


@pytest.mark.parametrize(
    ("name", "commands_"),
    [
        ("--worker", {"sim serve"}),  # ROLE@HOST:PORT only; the router's plain workers are --mixed URL
        ("--router", {"check spec", "spec control"}),  # the old spelling of --url; demo's front is --front
    ],
)
def test_renamed_options_stay_where_they_mean_one_thing(name: str, commands_: set[str]) -> None:
    _, long_uses = _uses()
    assert {path for path, _ in long_uses[name]} == commands_


def test_removed_short_letter_names_its_replacement(capsys: pytest.CaptureFixture[str]) -> None:
    # `bench -n 40` was --requests; now -n is only --nodes: the usage error says what to type instead
    assert main(["bench", "--url", "http://127.0.0.1:1", "-n", "40"]) == 64
    assert "--requests" in capsys.readouterr().err


def test_router_url_takes_host_port_as_the_profile_writes_it(capsys: pytest.CaptureFixture[str]) -> None:
    # router.listen is HOST:PORT; `--url 127.0.0.1:1` was refused as "URL missing http://" with the hint
    # to start a router: now it is asked, and the error is the real one (nothing listens on port 1)
    assert main(["router", "status", "--url", "127.0.0.1:1"]) == 3
    err = capsys.readouterr().err
    assert "http://127.0.0.1:1" in err
    assert "missing" not in err

"""Spellings retired so that every option letter and name means one thing across the CLI (issue 29):
a script that still uses one gets a usage error that names what to type instead, not a bare
"No such option". Keyed by the command's words (a prefix: "provision" covers lock and wheelhouse)."""

from __future__ import annotations

RETIRED: dict[tuple[str, str], str] = {
    ("bench", "-n"): "--requests",
    ("demo", "-n"): "--requests",
    ("logs", "-n"): "--lines",
    ("bench", "-r"): "--rate",
    ("provision", "-r"): "--requirement",
    ("plan kv", "-c"): "--context",
    ("plan tiers", "-c"): "--context",
    ("plan spec", "-c"): "--cost-ratio",
    ("plan cost", "-u"): "--utilisation",
    ("sim serve", "-w"): "--worker",
    ("sim serve", "--model"): "--served-model-name",
    ("router serve", "--worker"): "--mixed",
    ("demo", "--router"): "--front",
}


def replacement(command: str, option: str) -> str | None:
    """The hint for a retired `option` of `command`, or None."""
    for (where, old), new in RETIRED.items():
        if old == option and (command == where or command.startswith(where + " ")):
            letter = {"-n": "--nodes", "-r": "--role", "-c": "--concurrency", "-u": "--url", "-w": "--workload"}
            now = f" ({old} now means {letter[old]} everywhere)" if old in letter else ""
            return f"{old} was renamed: use {new}{now}"
    return None

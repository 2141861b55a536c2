"""The run marker that lets Ctrl-C find exactly this run's remote commands (no host needed)."""

from __future__ import annotations

import re
import shlex

import pytest

from infer_ctl.remote.base import Command
from infer_ctl.remote.commandline import SudoMode, build_argv, marker_pattern


def test_the_marker_tags_the_timeout_wrapper_before_the_callers_environment():
    argv, _ = build_argv(
        Command("sleep", "9"), sudo=False, sudo_mode=SudoMode(), env={"A": "1"}, timeout=5, marker="ab12-3"
    )
    assert argv == ["timeout", "-k", "3", "5", "env", "INFERCTL_RUN=ab12-3", "A=1", "sleep", "9"]


@pytest.mark.parametrize(
    ("cmdline", "matches"),
    [
        ("timeout -k 3 5 env INFERCTL_RUN=ab12-3 sleep 9", True),
        ("sudo -n -- timeout -k 3 5 env INFERCTL_RUN=ab12-3 A=1 sleep 9", True),
        ("timeout -k 3 5 env INFERCTL_RUN=ab12-3", True),
        ("timeout -k 3 5 env INFERCTL_RUN=ab12-34 sleep 9", False),  # another node/run of the same prefix
        ("timeout -k 3 5 env INFERCTL_RUN=ff12-3 sleep 9", False),
        ("sleep 9", False),
    ],
)
def test_the_pattern_matches_only_this_marker(cmdline, matches):
    assert bool(re.search(marker_pattern("ab12-3"), cmdline)) is matches


def test_the_pattern_does_not_match_the_abort_command_that_carries_it():
    pattern = marker_pattern("ab12-3")
    own = shlex.join(["sh", "-c", "pgrep -f ...", "inferctl-abort", pattern, "15"])
    assert not re.search(pattern, own)


@pytest.mark.parametrize("bad", ["", "-x", "a b", "a;b", "a.b", "ab'"])
def test_markers_that_could_break_the_pattern_are_refused(bad):
    with pytest.raises(ValueError):
        marker_pattern(bad)

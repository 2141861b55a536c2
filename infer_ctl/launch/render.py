"""Rendering of everything a node needs to run one SGLang instance: argv, env file, systemd unit.

Pure functions of the profile (the templates are files shipped with inferctl). The provisioner and the
launcher both call these, so what `provision` installs and what `launch` compares are byte-identical.
"""

from __future__ import annotations

import re
from functools import cache

import jinja2

from infer_ctl.core.sglang import (
    Instance,
    env_file_path,
    env_lines,
    instances,
    render_argv,
    unit_name,
    unit_path,
)
from infer_ctl.profile import Profile
from infer_ctl.resources import templates_dir

__all__ = [
    "Instance",
    "env_file_path",
    "instances",
    "render_argv",
    "render_env_file",
    "render_unit",
    "systemd_quote",
    "unit_name",
    "unit_path",
]

_SYSTEMD_BARE = re.compile(r"^[A-Za-z0-9_./:,@+=-]+$")


@cache
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def systemd_quote(word: str) -> str:
    """One ExecStart word: systemd expands `$VAR` and `%` specifiers and splits on spaces, so anything
    beyond plain characters is double-quoted with `\\`, `"` escaped and `$`/`%` doubled."""
    if _SYSTEMD_BARE.match(word):
        return word
    escaped = word.replace("\\", "\\\\").replace('"', '\\"').replace("$", "$$").replace("%", "%%")
    return f'"{escaped}"'


def render_env_file(profile: Profile, instance: Instance, *, gid_index: int | None = None) -> str:
    lines = env_lines(profile, instance, gid_index=gid_index)
    return (
        _env().get_template("sglang.env.j2").render(instance=instance, profile_name=profile.name, lines=lines)
    )


def start_limit_interval_s(profile: Profile) -> int:
    """StartLimitIntervalSec: long enough to hold `restart_limit_burst` starts that each fail as late
    as the start timeout allows (plus RestartSec), so the limit is reached even by a server that runs
    out of memory only at the end of a long model load."""
    lifecycle = profile.sglang.lifecycle
    return int(lifecycle.restart_limit_burst * (lifecycle.start_timeout_s + lifecycle.restart_sec)) + 1


def _seconds(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def render_unit(profile: Profile, instance: Instance) -> str:
    lifecycle = profile.sglang.lifecycle
    argv = render_argv(profile, instance)
    return (
        _env()
        .get_template(f"sglang-{instance.role}.service.j2")
        .render(
            instance=instance,
            profile_name=profile.name,
            user=lifecycle.user,
            env_file=env_file_path(instance),
            exec_start=" ".join(systemd_quote(w) for w in argv),
            start_timeout_s=int(lifecycle.start_timeout_s),
            stop_timeout_s=int(lifecycle.stop_timeout_s),
            limit_nofile=lifecycle.limit_nofile,
            start_limit_burst=lifecycle.restart_limit_burst,
            start_limit_interval_s=start_limit_interval_s(profile),
            restart_sec=_seconds(lifecycle.restart_sec),
        )
    )

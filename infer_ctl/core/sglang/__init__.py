"""SGLang launch rendering, pure: instances of a profile, their argv, environment and file paths."""

from infer_ctl.core.sglang.argv import (
    ArgOverride,
    RenderedArgv,
    build_argv,
    render_argv,
    server_args,
    venv_python,
)
from infer_ctl.core.sglang.envfile import env_lines, env_vars
from infer_ctl.core.sglang.instance import Instance, find_instance, instances
from infer_ctl.core.sglang.paths import (
    argv_file_path,
    env_file_path,
    log_file_path,
    pid_file_path,
    unit_name,
    unit_path,
)

__all__ = [
    "ArgOverride",
    "Instance",
    "RenderedArgv",
    "argv_file_path",
    "build_argv",
    "env_file_path",
    "env_lines",
    "env_vars",
    "find_instance",
    "instances",
    "log_file_path",
    "pid_file_path",
    "render_argv",
    "server_args",
    "unit_name",
    "unit_path",
    "venv_python",
]

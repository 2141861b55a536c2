"""Where an instance's files live on its node. Functions of the instance alone, so the provisioner and
the launcher agree without passing the profile around."""

from __future__ import annotations

from infer_ctl.core.sglang.instance import Instance

SYSTEMD_DIR = "/etc/systemd/system"


def unit_name(instance: Instance) -> str:
    # one server per role per node, so the role alone makes the unit unique on its node
    return f"inferctl-sglang-{instance.role}.service"


def unit_path(instance: Instance) -> str:
    return f"{SYSTEMD_DIR}/{unit_name(instance)}"


def env_file_path(instance: Instance) -> str:
    return f"{instance.config_dir.rstrip('/')}/sglang-{instance.role}.env"


def argv_file_path(instance: Instance) -> str:
    """The command line as JSON, for the process supervisor (nodes without systemd)."""
    return f"{instance.config_dir.rstrip('/')}/sglang-{instance.role}.argv.json"


def pid_file_path(instance: Instance) -> str:
    return f"{instance.config_dir.rstrip('/')}/sglang-{instance.role}.pid"


def log_file_path(instance: Instance) -> str:
    return f"{instance.log_dir.rstrip('/')}/sglang-{instance.role}.log"

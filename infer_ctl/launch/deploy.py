"""What a node gets for one instance: its env file (with the GID index read from that node) and its unit
(or, without systemd, its run script), each with its mode. The one source of these files: `launch`
writes them, `provision` plans them, `check servers` compares what is deployed and what runs with them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from infer_ctl.core.sglang import Instance, build_argv, env_file_path, unit_path
from infer_ctl.core.spec.pools import server_override
from infer_ctl.launch import gid, supervisor
from infer_ctl.launch.render import render_env_file, render_unit
from infer_ctl.profile import Profile
from infer_ctl.remote.base import Connector

#: env files: read by systemd (as root, before it drops to the unit's User=) or sourced by the user the
#: process supervisor runs the server as; nobody else. They may carry tokens a user put in
#: `sglang.env` despite the advice.
ENV_FILE_MODE = 0o600
UNIT_FILE_MODE = 0o644
RUN_FILE_MODE = 0o755


@dataclass(frozen=True)
class DeployedFile:
    path: str
    text: str
    mode: int


@dataclass(frozen=True)
class Deployment:
    instance: Instance
    #: empty when the instance must not be deployed (`gid.error`)
    files: list[DeployedFile] = field(default_factory=list)
    #: the RoCE GID index read on the node (None: not probed; the profile's pin, if any, is used)
    gid: gid.GidDecision | None = None

    @property
    def refused(self) -> str | None:
        """Why nothing may be written for this instance: on RoCE an env file without the right
        MC_GID_INDEX makes Mooncake use GID 3 silently."""
        return self.gid.error if self.gid is not None and self.gid.error else None

    @property
    def gid_index(self) -> int | None:
        return self.gid.index if self.gid is not None else None


def gid_decision(conn: Connector, profile: Profile, inst: Instance) -> gid.GidDecision | None:
    """The GID index decision for an instance on its node (None when none is needed or it is pinned)."""
    node = profile.node(inst.node)
    return gid.probe(conn, profile, node, inst) if gid.needs_probe(profile, node, inst) else None


def rendered_files(
    profile: Profile, inst: Instance, sup: supervisor.Supervisor, *, gid_index: int | None = None
) -> list[DeployedFile]:
    """Pure: the files for a known GID index."""
    files = [DeployedFile(env_file_path(inst), render_env_file(profile, inst, gid_index=gid_index), ENV_FILE_MODE)]
    if sup == "systemd":
        files.append(DeployedFile(unit_path(inst), render_unit(profile, inst), UNIT_FILE_MODE))
    else:
        script = supervisor.render_run_script(build_argv(profile, inst).argv, inst)
        files.append(DeployedFile(supervisor.run_file_path(inst), script, RUN_FILE_MODE))
    pool = server_override(profile, inst.node, inst.role, inst.config_dir)
    if pool is not None and pool.adaptive_config is not None:  # read by SGLang's --speculative-adaptive-config
        files.append(DeployedFile(*pool.adaptive_config, UNIT_FILE_MODE))
    return files


def deployment(conn: Connector, profile: Profile, inst: Instance, sup: supervisor.Supervisor) -> Deployment:
    """Read what the node decides (the GID index) and render the instance's files."""
    decision = gid_decision(conn, profile, inst)
    if decision is not None and decision.error:
        return Deployment(inst, [], decision)
    return Deployment(inst, rendered_files(profile, inst, sup, gid_index=decision.index if decision else None), decision)

"""Each node's host as the SSH connection resolves it (~/.ssh/config HostName): the address a pair-test
client is given for a server whose RoCE GID carries no IPv4 (core/fabric/endpoints.py)."""

from __future__ import annotations

from collections.abc import Sequence

from infer_ctl.errors import InferctlError
from infer_ctl.profile import Node, Profile


def resolved_hosts(profile: Profile, nodes: Sequence[Node]) -> dict[str, str]:
    """node name -> host after ~/.ssh/config; {} when the config cannot be read (the profile's hosts stay)."""
    from infer_ctl.remote.target import TargetResolver  # paramiko: only when pair tests run

    try:
        resolver = TargetResolver(profile)
        return {n.name: resolver.for_node(n).host for n in nodes}
    except InferctlError:
        return {}

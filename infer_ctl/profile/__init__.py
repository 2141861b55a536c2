"""The cluster profile: pydantic models (the truth about its shape), loading and error rendering."""

from infer_ctl.profile.fabric import FabricPolicy, PingPongSettings
from infer_ctl.profile.gpu import GpuPolicy
from infer_ctl.profile.load import load_profile, parse_profile_text, resolve_profile_path
from infer_ctl.profile.models import DraftModel, Models, SpecAlgorithm, TargetModel
from infer_ctl.profile.nodes import Node, NodeOverrides, RdmaConfig, Role
from infer_ctl.profile.profile import Profile
from infer_ctl.profile.router import NamedPrefix, RouterSettings
from infer_ctl.profile.sglang import SglangSettings
from infer_ctl.profile.ssh import SshSettings

__all__ = [
    "DraftModel",
    "FabricPolicy",
    "GpuPolicy",
    "Models",
    "NamedPrefix",
    "Node",
    "NodeOverrides",
    "PingPongSettings",
    "Profile",
    "RdmaConfig",
    "Role",
    "RouterSettings",
    "SglangSettings",
    "SpecAlgorithm",
    "SshSettings",
    "TargetModel",
    "load_profile",
    "parse_profile_text",
    "resolve_profile_path",
]

"""The ordered list of steps. Order matters: the venv needs its wheelhouse; inferctl shares the venvs directory; units come last so a server
that a restart brings up finds its venv, limits, sysctls and its user already in place."""

from __future__ import annotations

from infer_ctl.provision.steps.base import Step
from infer_ctl.provision.steps.driver import DriverStep
from infer_ctl.provision.steps.firewall import FirewallStep
from infer_ctl.provision.steps.logrotate import LogrotateStep
from infer_ctl.provision.steps.memlock import MemlockStep
from infer_ctl.provision.steps.peermem import PeermemStep
from infer_ctl.provision.steps.persistence import PersistenceStep
from infer_ctl.provision.steps.qos import QosStep
from infer_ctl.provision.steps.selfinstall import InferctlStep
from infer_ctl.provision.steps.serveruser import ServerUserStep
from infer_ctl.provision.steps.sysctl import SysctlStep
from infer_ctl.provision.steps.timesync import TimeSyncStep
from infer_ctl.provision.steps.units import UnitsStep
from infer_ctl.provision.steps.venv import VenvStep, WheelhouseStep


def all_steps() -> list[Step]:
    return [
        DriverStep(),
        PersistenceStep(),
        PeermemStep(),
        MemlockStep(),
        SysctlStep(),
        FirewallStep(),
        TimeSyncStep(),
        QosStep(),
        WheelhouseStep(),
        VenvStep(),
        InferctlStep(),
        ServerUserStep(),
        LogrotateStep(),
        UnitsStep(),
    ]


def step_names() -> list[str]:
    return [s.name for s in all_steps()]

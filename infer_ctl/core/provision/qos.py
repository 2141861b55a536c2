"""RoCE QoS desired state (trust, PFC on one priority) against what `mlnx_qos -i <if>` shows, in the
argument form of `mlnx_qos --trust/--pfc`.

A setting the NIC does not show cannot be planned: where the NIC or driver has no trust mode, mlnx_qos
prints "Priority trust state is not supported on your system" and `Priority trust state: none`, and
exits 1 when asked for `--trust` (python/mlnx_qos in Mellanox/mlnx-tools); old mlnx-tools print no trust
line at all. Planning `--trust` there would be a change that fails and is planned again on every run,
so such a setting is reported as unsupported instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from infer_ctl.core.fabric.facts import QosFacts

#: how each setting is named in plans (and the order of `mlnx_qos` arguments)
LABELS = {"trust": "trust", "pfc": "PFC"}


def desired_pfc(priority: int) -> tuple[int, ...]:
    return tuple(1 if p == priority else 0 for p in range(8))


def pfc_arg(flags: tuple[int, ...]) -> str:
    return ",".join(str(f) for f in flags)


@dataclass(frozen=True)
class QosSettings:
    """The settings this NIC shows, wanted and current (`mlnx_qos` values), and those it does not."""

    want: dict[str, str] = field(default_factory=dict)
    have: dict[str, str] = field(default_factory=dict)
    #: settings the NIC does not show ("trust", "pfc"): cannot be applied with mlnx_qos
    unsupported: tuple[str, ...] = ()

    @property
    def converged(self) -> bool:
        return self.have == self.want


def qos_settings(qos: QosFacts, trust: str, pfc_priority: int) -> QosSettings:
    want: dict[str, str] = {}
    have: dict[str, str] = {}
    unsupported: list[str] = []
    if qos.trust is None:
        unsupported.append("trust")
    else:
        want["trust"], have["trust"] = trust, qos.trust
    if qos.pfc is None:
        unsupported.append("pfc")
    else:
        want["pfc"], have["pfc"] = pfc_arg(desired_pfc(pfc_priority)), pfc_arg(tuple(int(on) for on in qos.pfc))
    return QosSettings(want, have, tuple(unsupported))

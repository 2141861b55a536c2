"""Pure provisioning logic: exit codes of a fleet plan, lockfiles, diffs, parsers of probe output."""

from __future__ import annotations

import pytest

from infer_ctl.core.provision.desired import backup_path, missing_ports, sysctl_settings
from infer_ctl.core.provision.diff import file_diff, settings_diff
from infer_ctl.core.provision.lock import lock_hash, locked_version, make_lock, venv_dir, wheelhouse_dir
from infer_ctl.core.provision.model import EntryKind, NodePlan, PlanEntry, fleet_exit_code
from infer_ctl.core.provision.qos import qos_settings
from infer_ctl.exitcodes import ExitCode
from infer_ctl.facts.firewall import firewalld_ports, firewalld_running, ufw_active, ufw_allowed
from infer_ctl.facts.gpu_driver import parse_cuda_version, parse_gpu_csv, parse_os_release
from infer_ctl.facts.qos import QosParseError, parse_mlnx_qos

# Real `mlnx_qos -i eth4` output (shared fixtures: mlnx_qos/netarbiter-eth4-trust-dscp-pfc-prio3.txt).
MLNX_QOS_DSCP_PRIO3 = 'DCBX mode: OS controlled\nPriority trust state: dscp\ndscp2prio mapping:\n        prio:0 dscp:07,06,05,04,03,02,01,00,\n        prio:1 dscp:15,14,13,12,11,10,09,08,\n        prio:2 dscp:23,22,21,20,19,18,17,16,\n        prio:3 dscp:31,30,29,28,27,26,25,24,\n        prio:4 dscp:39,38,37,36,35,34,33,32,\n        prio:5 dscp:47,46,45,44,43,42,41,40,\n        prio:6 dscp:55,54,53,52,51,50,49,48,\n        prio:7 dscp:63,62,61,60,59,58,57,56,\nCable len: 7\nPFC configuration:\n        priority    0   1   2   3   4   5   6   7\n        enabled     0   0   0   1   0   0   0   0   \ntc: 0 ratelimit: unlimited, tsa: vendor\n         priority:  1\ntc: 1 ratelimit: unlimited, tsa: vendor\n         priority:  0\ntc: 2 ratelimit: unlimited, tsa: vendor\n         priority:  2\ntc: 3 ratelimit: unlimited, tsa: vendor\n         priority:  3\ntc: 4 ratelimit: unlimited, tsa: vendor\n         priority:  4\ntc: 5 ratelimit: unlimited, tsa: vendor\n         priority:  5\ntc: 6 ratelimit: unlimited, tsa: vendor\n         priority:  6\ntc: 7 ratelimit: unlimited, tsa: vendor\n         priority:  7\n'


def plan(*kinds: EntryKind, **kw: object) -> NodePlan:
    return NodePlan("n", tuple(PlanEntry("n", "s", str(i), k, "x") for i, k in enumerate(kinds)), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("plans", "code"),
    [
        ([plan(EntryKind.OK, EntryKind.SKIP)], ExitCode.OK),
        ([plan(EntryKind.OK), plan(EntryKind.CHANGE)], ExitCode.WARN),
        ([plan(EntryKind.MANUAL)], ExitCode.WARN),
        ([plan(EntryKind.CHANGE), plan(unreachable=True, error="down")], ExitCode.UNKNOWN),
        ([plan(EntryKind.ERROR), plan(unreachable=True, error="down")], ExitCode.FAIL),
        ([plan(EntryKind.OK, error="apply failed")], ExitCode.FAIL),
        ([plan(EntryKind.OK), plan(EntryKind.CHANGE, skipped=True, error="--fail-fast")], ExitCode.UNKNOWN),
    ],
)
def test_fleet_exit_code(plans: list[NodePlan], code: ExitCode) -> None:
    assert fleet_exit_code(plans) == code


def test_lock_pins_every_wheel_and_names_the_venv() -> None:
    lock = make_lock({"sglang-0.5.23-py3-none-any.whl": "aa", "Tiny_Dep-1.0-py3-none-any.whl": "bb"})
    assert lock == "sglang==0.5.23 --hash=sha256:aa\ntiny-dep==1.0 --hash=sha256:bb\n"
    assert locked_version(lock) == "0.5.23"
    assert venv_dir("/opt/inferctl/venvs/", "0.5.23", lock) == f"/opt/inferctl/venvs/sglang-0.5.23-{lock_hash(lock)}"
    assert wheelhouse_dir("/opt/inferctl/venvs", lock) == f"/opt/inferctl/wheelhouse/{lock_hash(lock)}"
    with pytest.raises(ValueError, match="two versions"):
        make_lock({"a-1-py3-none-any.whl": "1", "a-2-py3-none-any.whl": "2"})
    with pytest.raises(ValueError, match="not a wheel"):
        make_lock({"sglang-0.5.23.tar.gz": "1"})


def test_diffs() -> None:
    diff = file_diff("/etc/x", b"a=1\nb=2\n", b"a=1\nb=3\n")
    assert "-b=2\n" in diff and "+b=3\n" in diff and "(node)" in diff
    assert file_diff("/etc/x", None, b"new\n").startswith("--- /dev/null")
    assert settings_diff({"k": "1", "j": None}, {"k": "2", "j": "5", "same": "x"}) == "k: 1 -> 2\nj: <unset> -> 5\nsame: <unset> -> x"


def test_sysctl_reserves_only_configured_ports_inside_the_ephemeral_range() -> None:
    settings = sysctl_settings([30000, 8998, 40000, 15000], hugepages=None)
    assert settings["net.ipv4.ip_local_reserved_ports"] == "40000"
    assert "vm.nr_hugepages" not in settings
    assert sysctl_settings([], hugepages=512)["vm.nr_hugepages"] == "512"


def test_backup_name_is_never_loaded_by_conf_globs() -> None:
    from datetime import UTC, datetime

    name = backup_path("/etc/sysctl.d/90-inferctl.conf", datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    assert name.startswith("/etc/sysctl.d/90-inferctl.conf.inferctl-backup-20260102T030405")
    assert not name.endswith((".conf", ".service"))


def test_firewall_parsers() -> None:
    status = "Status: active\n\nTo                         Action      From\n--                         ------      ----\n30000/tcp                  ALLOW       Anywhere\n15000:17000/tcp            ALLOW       Anywhere\n30000/tcp (v6)             ALLOW       Anywhere (v6)\n"
    assert ufw_active(status) and not ufw_active("Status: inactive\n")
    assert missing_ports(["30000/tcp", "15000:17000/tcp", "8998/tcp"], ufw_allowed(status)) == ["8998/tcp"]
    assert firewalld_ports("30000/tcp 15000-17000/tcp") == {"30000/tcp", "15000:17000/tcp"}
    assert firewalld_running("running\n") and not firewalld_running("not running\n")


def test_mlnx_qos_parsers_on_real_output() -> None:
    """Provisioning reads mlnx_qos with the parser `check fabric` uses (facts.qos.parse_mlnx_qos)."""
    qos = parse_mlnx_qos(MLNX_QOS_DSCP_PRIO3)
    assert qos.trust == "dscp"
    assert qos_settings(qos, "dscp", 3).have == {"trust": "dscp", "pfc": "0,0,0,1,0,0,0,0"}
    assert qos_settings(qos, "dscp", 3).converged
    with pytest.raises(QosParseError):
        parse_mlnx_qos("no table")


def test_driver_probe_parsers() -> None:
    gpus, loaded = parse_gpu_csv("0, NVIDIA H100 80GB HBM3, 550.90.07, Enabled\n1, NVIDIA H100 80GB HBM3, 550.90.07, Disabled\n")
    assert gpus == [("0", "NVIDIA H100 80GB HBM3", "Enabled"), ("1", "NVIDIA H100 80GB HBM3", "Disabled")]
    assert loaded == "550.90.07"
    assert parse_gpu_csv("No devices were found\n") == ([], None)
    assert parse_cuda_version("| NVIDIA-SMI 550.90.07   Driver Version: 550.90.07   CUDA Version: 12.4 |") == "12.4"
    assert parse_os_release('NAME="Ubuntu"\nPRETTY_NAME="Ubuntu 22.04.4 LTS"\n') == "Ubuntu 22.04.4 LTS"

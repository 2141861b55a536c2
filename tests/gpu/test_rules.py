"""GPU rules, table-driven: facts in, (check id, status, message fragment) out. Pure; no host."""

from __future__ import annotations

from pathlib import Path

import pytest

from infer_ctl.core.findings import Status
from infer_ctl.core.gpu import rules
from infer_ctl.core.gpu.facts import GpuFacts, GpuProcess, NodeGpuFacts, NvLink, XidEvent
from infer_ctl.profile.gpu import GpuPolicy

P = GpuPolicy()
HEALTHY = GpuFacts(
    index=3, persistence_mode=True, ecc_current=True, ecc_pending=True, ecc_volatile_uncorrected=0,
    ecc_aggregate_uncorrected=0, remap_pending=False, remap_failure=False, remap_uncorrectable=0,
    recovery_action="none", temp_c=40, slowdown_temp_c=89, clock_reasons=frozenset({"gpu_idle"}),
    pcie_width_current=16, pcie_width_max=16, pcie_gen_current=2, pcie_gen_max=5, utilization_pct=0,
    mig_current=False, mig_pending=False, memory_used_mib=0, processes=(),
    nvlinks=tuple(NvLink(i, True, 26.562, 0, 0, 0) for i in range(18)), pci_bus_id="00000000:86:00.0",
)
LINKS_4_5_DOWN = tuple(NvLink(i, i not in (4, 5), None, 0, 0, 0) for i in range(18))

# (name, rule, facts changes, policy changes, expected status or None for "no finding", message fragment)
CASES = [
    ("persistence ok", rules.judge_persistence, {}, {}, Status.OK, "enabled"),
    ("persistence off", rules.judge_persistence, {"persistence_mode": False}, {}, Status.WARN, "disabled"),
    ("persistence not required", rules.judge_persistence, {"persistence_mode": False}, {"require_persistence": False}, None, ""),
    ("persistence N/A", rules.judge_persistence, {"persistence_mode": None}, {}, None, ""),
    ("ecc off", rules.judge_ecc_mode, {"ecc_current": False, "ecc_pending": False}, {}, Status.WARN, "disabled"),
    ("ecc change pending", rules.judge_ecc_mode, {"ecc_pending": False}, {}, Status.WARN, "pending"),
    ("ecc volatile DBE", rules.judge_ecc_errors, {"ecc_volatile_uncorrected": 2}, {}, Status.FAIL, "2 uncorrectable"),
    ("ecc aggregate only", rules.judge_ecc_errors, {"ecc_aggregate_uncorrected": 5}, {}, Status.WARN, "lifetime"),
    ("sram threshold", rules.judge_ecc_errors, {"sram_threshold_exceeded": True}, {}, Status.FAIL, "SRAM"),
    ("ecc ok", rules.judge_ecc_errors, {}, {}, Status.OK, "no uncorrectable"),
    ("remap failure", rules.judge_row_remap, {"remap_failure": True}, {}, Status.FAIL, "failed"),
    ("remap pending", rules.judge_row_remap, {"remap_pending": True}, {}, Status.FAIL, "pending"),
    ("remap 512 unc", rules.judge_row_remap, {"remap_uncorrectable": 512}, {}, Status.WARN, "512 rows"),
    ("remap 511 unc", rules.judge_row_remap, {"remap_uncorrectable": 511}, {}, Status.OK, "no pending"),
    ("remap N/A (Turing)", rules.judge_row_remap, {"remap_pending": None, "remap_failure": None}, {}, None, ""),
    ("retired pending", rules.judge_retired_pages, {"retired_sbe": 1, "retired_dbe": 0, "retired_pending": True}, {}, Status.WARN, "pending"),
    ("retired at limit", rules.judge_retired_pages, {"retired_sbe": 40, "retired_dbe": 20}, {}, Status.FAIL, "60 retired"),
    ("retired below limit", rules.judge_retired_pages, {"retired_sbe": 40, "retired_dbe": 19}, {}, Status.OK, "59"),
    ("recovery reset", rules.judge_recovery_action, {"recovery_action": "gpu_reset"}, {}, Status.FAIL, "gpu_reset"),
    ("recovery reboot", rules.judge_recovery_action, {"recovery_action": "node_reboot"}, {}, Status.FAIL, "node_reboot"),
    ("recovery drain p2p", rules.judge_recovery_action, {"recovery_action": "drain_p2p"}, {}, Status.WARN, "drain_p2p"),
    ("recovery none", rules.judge_recovery_action, {}, {}, Status.OK, "no recovery"),
    ("temp ok", rules.judge_temperature, {}, {}, Status.OK, "40 C"),
    ("temp near slowdown", rules.judge_temperature, {"temp_c": 84}, {}, Status.WARN, "5 C from slowdown"),
    ("temp at slowdown", rules.judge_temperature, {"temp_c": 89}, {}, Status.FAIL, "slowdown"),
    ("temp over profile max", rules.judge_temperature, {"temp_c": 80, "slowdown_temp_c": 95}, {"max_temp_c": 75}, Status.WARN, "profile limit"),
    ("tlimit margin ok", rules.judge_temperature, {"slowdown_temp_c": None, "tlimit_margin_c": 58, "tlimit_slowdown_c": -2}, {}, Status.OK, "40 C"),
    ("tlimit margin low", rules.judge_temperature, {"slowdown_temp_c": None, "tlimit_margin_c": 2, "tlimit_slowdown_c": -2}, {}, Status.WARN, "4 C from"),
    ("tlimit margin hit", rules.judge_temperature, {"slowdown_temp_c": None, "tlimit_margin_c": -2, "tlimit_slowdown_c": -2}, {}, Status.FAIL, "slowdown"),
    ("throttle thermal", rules.judge_throttle, {"clock_reasons": frozenset({"hw_thermal_slowdown", "gpu_idle"})}, {}, Status.WARN, "hw_thermal_slowdown"),
    ("throttle power brake", rules.judge_throttle, {"clock_reasons": frozenset({"hw_power_brake_slowdown"})}, {}, Status.WARN, "power_brake"),
    ("throttle sw cap only", rules.judge_throttle, {"clock_reasons": frozenset({"sw_power_cap", "applications_clocks_setting"})}, {}, Status.OK, "no hardware"),
    ("pcie width degraded", rules.judge_pcie, {"pcie_width_current": 8}, {}, Status.FAIL, "x8, expected x16"),
    ("pcie width platform x8", rules.judge_pcie, {"pcie_width_current": 8}, {"expected_pcie_width": 8}, Status.OK, "x8"),
    ("pcie gen low at idle", rules.judge_pcie, {}, {}, Status.OK, "not judged at idle"),
    ("pcie gen low under load", rules.judge_pcie, {"utilization_pct": 90}, {}, Status.WARN, "Gen2 under load"),
    ("nvlink ok", rules.judge_nvlink, {}, {}, Status.OK, "18 NVLink links active"),
    ("nvlink 2 down", rules.judge_nvlink, {"nvlinks": LINKS_4_5_DOWN}, {}, Status.FAIL, "4, 5"),
    ("nvlink down not required", rules.judge_nvlink, {"nvlinks": LINKS_4_5_DOWN}, {"nvlink_required": False}, Status.WARN, "inactive"),
    ("nvlink all inactive", rules.judge_nvlink, {"nvlinks": (), "nvlink_note": "all links inactive"}, {}, Status.FAIL, "all NVLink"),
    ("nvlink errors", rules.judge_nvlink, {"nvlinks": (NvLink(0, True, None, 3, 0, 1),)}, {}, Status.WARN, "3 replay, 1 crc"),
    ("no nvlink (PCIe GPU)", rules.judge_nvlink, {"nvlinks": (), "nvlink_note": "no NVLink"}, {}, Status.SKIP, "no NVLink"),
    ("nvlink not gathered", rules.judge_nvlink, {"nvlinks": None}, {}, None, ""),
    ("mig as expected", rules.judge_mig, {}, {}, Status.OK, "disabled"),
    ("mig unexpected", rules.judge_mig, {"mig_current": True, "mig_pending": True}, {}, Status.FAIL, "expects disabled"),
    ("mig pending", rules.judge_mig, {"mig_pending": True}, {}, Status.WARN, "pending"),
    ("mig any", rules.judge_mig, {"mig_current": True, "mig_pending": True}, {"expected_mig": "any"}, Status.OK, "enabled"),
    ("mig unsupported, expected", rules.judge_mig, {"mig_current": None}, {"expected_mig": "enabled"}, Status.WARN, "not supported"),
    ("stray memory", rules.judge_stray_memory, {"memory_used_mib": 5000, "processes": (GpuProcess(77, "python3", 4990),)}, {"expect_idle": True}, Status.WARN, "python3 (pid 77)"),
    ("idle memory ok", rules.judge_stray_memory, {"memory_used_mib": 500}, {"expect_idle": True}, Status.OK, "500 MiB"),
    ("busy GPUs not judged", rules.judge_stray_memory, {"memory_used_mib": 70000}, {}, None, ""),
    ("gpu lost", lambda n, g, p: rules.judge_nvml_errors(n, g), {"errors": ("GPU is lost",)}, {}, Status.FAIL, "GPU is lost"),
    ("reset required", lambda n, g, p: rules.judge_nvml_errors(n, g), {"errors": ("GPU requires reset",)}, {}, Status.FAIL, "requires reset"),
]


def _call(rule, gpu: GpuFacts, policy: GpuPolicy):  # type: ignore[no-untyped-def]
    import inspect

    if len(inspect.signature(rule).parameters) == 2:
        return rule("n1", gpu)
    return rule("n1", gpu, policy)


@pytest.mark.parametrize(("name", "rule", "changes", "pchanges", "status", "fragment"), CASES, ids=[c[0] for c in CASES])
def test_gpu_rule(name, rule, changes, pchanges, status, fragment) -> None:  # type: ignore[no-untyped-def]
    finding = _call(rule, HEALTHY.with_(**changes), P.model_copy(update=pchanges))
    if status is None:
        assert finding is None
        return
    assert finding is not None and finding.status is status, finding
    assert fragment in finding.message
    assert finding.subject == "GPU3" and finding.node == "n1"
    if status in (Status.WARN, Status.FAIL):
        assert finding.remedy, "every problem says what to do next"


def _node(**kw) -> NodeGpuFacts:  # type: ignore[no-untyped-def]
    base = {"source": "nvml", "driver_version": "550.54.15", "cuda_version": "12.4", "gpu_count": 1,
            "gpus": (HEALTHY,), "xids": ()}
    return NodeGpuFacts(**{**base, **kw})


def test_healthy_node_is_all_ok() -> None:
    findings = rules.judge_node("n1", _node(), P, 1)
    assert findings and all(f.status is Status.OK for f in findings)
    assert {f.check for f in findings} >= {"gpu.count", "gpu.driver", "gpu.ecc_errors", "gpu.row_remap", "gpu.xid"}


@pytest.mark.parametrize(
    ("kind", "expected_gpus", "status", "fragment"),
    [
        ("no_driver", 8, Status.UNKNOWN, "install the NVIDIA driver"),
        ("no_driver", 0, Status.SKIP, None),
        ("driver_mismatch", 8, Status.FAIL, "reboot"),
        ("hardware", 8, Status.FAIL, "RMA"),
        ("no_permission", 8, Status.UNKNOWN, "video group"),
        ("tool_failed", 8, Status.UNKNOWN, "nvidia-smi -q -x"),
    ],
)
def test_node_errors(kind: str, expected_gpus: int, status: Status, fragment: str | None) -> None:
    facts = NodeGpuFacts(source="none", error="boom", error_kind=kind, xids=())
    (finding, *rest) = rules.judge_node("n1", facts, P, expected_gpus)
    assert finding.check == "gpu.driver" and finding.status is status
    assert fragment is None or fragment in (finding.remedy or "")
    assert [f.check for f in rest] == ["gpu.xid"]


def test_count_and_driver_policy() -> None:
    assert rules.judge_count("n1", _node(gpu_count=7), 8).status is Status.FAIL
    pinned = P.model_copy(update={"driver_version": "550.90.07"})
    assert rules.judge_driver("n1", _node(), pinned).status is Status.FAIL
    minimum = P.model_copy(update={"min_driver_version": "550.100"})
    assert rules.judge_driver("n1", _node(), minimum).status is Status.FAIL
    assert rules.judge_driver("n1", _node(), P.model_copy(update={"min_driver_version": "535.1"})).status is Status.OK
    assert rules.judge_driver("n1", _node(), P.model_copy(update={"cuda_version": "12.8"})).status is Status.WARN


def test_fleet_consistency_flags_the_minority() -> None:
    out = rules.judge_fleet_consistency(
        {"a": ("550.54.15", "12.4"), "b": ("550.54.15", "12.4"), "c": ("535.104.05", "12.2")}
    )
    statuses = {f.node: f.status for f in out}
    assert statuses == {"a": Status.OK, "b": Status.OK, "c": Status.WARN}
    assert rules.judge_fleet_consistency({"a": ("550", "12.4")}) == []


XID_CASES = [
    # events, policy changes, expected {subject: status}
    ([XidEvent(79, "0000:86:00", "fallen off")], {}, {"GPU3": Status.FAIL}),
    ([XidEvent(13, "0000:86:00", "SM exception")], {}, {"GPU3": Status.WARN}),
    ([XidEvent(94, "0000:86:00", "contained")], {"xid_overrides": {94: "warn"}}, {"GPU3": Status.WARN}),
    ([XidEvent(13, "0000:86:00", "x")], {"xid_overrides": {13: "ignore"}}, {"node": Status.OK}),
    ([XidEvent(31, "0000:86:00", "x")], {"ignore_xids": [31]}, {"node": Status.OK}),
    ([XidEvent(48, "0000:99:00", "DBE")], {}, {"PCI:0000:99:00": Status.FAIL}),  # a GPU the driver no longer lists
    ([XidEvent(13, "0000:86:00", "a"), XidEvent(48, "0000:86:00", "b")], {}, {"GPU3": Status.FAIL}),
    ([], {}, {"node": Status.OK}),
]


@pytest.mark.parametrize(("events", "pchanges", "expected"), XID_CASES)
def test_xids(events, pchanges, expected) -> None:  # type: ignore[no-untyped-def]
    findings = rules.judge_xids("n1", _node(xids=tuple(events)), P.model_copy(update=pchanges))
    assert {f.subject: f.status for f in findings} == expected


def test_unreadable_kernel_log_is_unknown_with_a_remedy() -> None:
    (f,) = rules.judge_xids("n1", _node(xids=None, xid_error="Permission denied"), P)
    assert f.status is Status.UNKNOWN and "Permission denied" in f.message and "systemd-journal" in (f.remedy or "")


def test_nvml_error_remedy_names_the_gpu_index() -> None:
    from infer_ctl.core.gpu.rules import judge_nvml_errors

    finding = judge_nvml_errors("n1", GpuFacts(index=2, errors=("nvmlDeviceGetPowerUsage: Unknown Error",)))
    assert finding is not None and "nvidia-smi -q -i 2" in (finding.remedy or "")


# Profile `gpu:` sections as a user writes them (validated, so list defaults yield to given lists),
# one XID seen on GPU3, expected status and the profile field that decided it.
XID_POLICY_CASES = [
    ({}, 79, Status.FAIL, "fatal_xids"),
    ({}, 13, Status.WARN, "warn_xids"),
    # DCGM's health watch warns on these (DcgmHealthWatch.cpp BuildXidMappings); XID 94's own remedy is
    # "restart the application", 63 is a pending remap that gpu.row_remap judges
    ({}, 61, Status.WARN, "warn_xids"),
    ({}, 62, Status.WARN, "warn_xids"),
    ({}, 63, Status.WARN, "warn_xids"),
    ({}, 94, Status.WARN, "warn_xids"),
    ({}, 92, Status.WARN, "warn_xids"),  # DCGM silent, gpud: warning
    ({}, 68, Status.FAIL, "fatal_xids"),  # DCGM silent, gpud: fatal
    ({}, 38, Status.WARN, "warn_xids"),  # DCGM PCIe watch
    ({}, 140, Status.FAIL, "fatal_xids"),
    ({}, 999, Status.WARN, "unlisted"),  # in no list: warns (documented in profile/gpu.py)
    ({"warn_xids": [94]}, 94, Status.WARN, "warn_xids"),  # moved out of the default fatal list
    ({"warn_xids": [94]}, 79, Status.FAIL, "fatal_xids"),  # the rest of the fatal defaults stay
    ({"warn_xids": [94]}, 13, Status.WARN, "unlisted"),  # the warn defaults were replaced
    ({"fatal_xids": [13]}, 13, Status.FAIL, "fatal_xids"),  # moved out of the default warn list
    ({"fatal_xids": [13]}, 31, Status.WARN, "warn_xids"),
    ({"fatal_xids": [13]}, 79, Status.WARN, "unlisted"),  # the fatal defaults were replaced
    ({"ignore_xids": [79]}, 79, Status.OK, None),  # skipped
    ({"ignore_xids": [13]}, 13, Status.OK, None),
    ({"xid_overrides": {79: "warn"}}, 79, Status.WARN, "xid_overrides"),
    ({"xid_overrides": {13: "fatal"}}, 13, Status.FAIL, "xid_overrides"),
    ({"xid_overrides": {13: "fatal"}, "ignore_xids": [13]}, 13, Status.FAIL, "xid_overrides"),
    ({"fatal_xids": [94], "warn_xids": [94], "xid_overrides": {94: "warn"}}, 94, Status.WARN, "xid_overrides"),
]


@pytest.mark.parametrize(("gpu_section", "xid", "status", "decided_by"), XID_POLICY_CASES)
def test_xid_lists_and_overrides(gpu_section, xid, status, decided_by) -> None:  # type: ignore[no-untyped-def]
    policy = GpuPolicy.model_validate(gpu_section)
    (f,) = rules.judge_xids("n1", _node(xids=(XidEvent(xid, "0000:86:00", "msg"),)), policy)
    assert f.status is status
    if decided_by is None:
        assert f.subject == "node"
    else:
        assert f.subject == "GPU3" and f.details["classified_by"] == {str(xid): decided_by}
        assert ("in none of gpu.fatal_xids/warn_xids/ignore_xids" in (f.remedy or "")) is (decided_by == "unlisted")


def test_one_xid_in_both_given_lists_is_a_profile_error_naming_the_fix(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import yaml

    from infer_ctl.errors import ProfileError
    from infer_ctl.profile import load_profile

    data = yaml.safe_load((Path(__file__).parents[2] / "profiles" / "local.yaml").read_text())
    data["gpu"] = {**(data.get("gpu") or {}), "fatal_xids": [79, 94], "warn_xids": [94]}
    bad = tmp_path / "p.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError) as exc:
        load_profile(str(bad))
    text = str(exc.value.message) + str(exc.value.remedy or "")
    assert "gpu" in text and "XID 94 is in both fatal_xids and warn_xids" in text and "xid_overrides" in text

"""`dcgmi diag -r N -j`: DCGM's results per test and GPU, judged into `gpu.diag` findings.

DCGM says pass/fail itself; what this adds is one finding per (test, GPU) and a remedy from DCGM's own
error severity (dcgmlib/dcgm_errors.h, `dcgmErrorSeverity_t`, and the per-error table in
dcgmlib/src/dcgm_errors.c, DCGM 4.x): ISOLATE ("cannot perform workload, GPU should be isolated") and
RESET ("drain and reset GPU") drain the node (`audit --remediate` acts on it), MONITOR keeps it in
service and watches, CONFIG is a setting to fix, TRIAGE asks for a field diagnostic. A failure without a
severity (DCGM 3.x wrote bare warning strings) is judged by its category: Deployment failures are
software/configuration, everything else (Hardware, Integration, Stress, Performance) drains.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from infer_ctl.core.findings import Finding, Status

#: dcgmErrorSeverity_t (dcgmlib/dcgm_errors.h)
SEVERITY = {0: "none", 1: "monitor", 2: "isolate", 3: "unknown", 4: "triage", 5: "config", 6: "reset"}
DRAIN_SEVERITIES = frozenset({"isolate", "reset"})
#: what DCGM documents per run level (docs.nvidia.com dcgm-diagnostics.html, "Run Levels"), for messages
LEVELS = {1: "quick (software, deployment)", 2: "medium (+ memory, PCIe, short stress)",
          3: "long (+ targeted stress/power, memory bandwidth)", 4: "extended (+ memtest, pulse, EUD)"}


@dataclass(frozen=True)
class DcgmWarning:
    message: str
    error_id: int | None = None
    category: int | None = None
    severity: int | None = None

    @property
    def severity_name(self) -> str | None:
        return None if self.severity is None else SEVERITY.get(self.severity, f"severity {self.severity}")


@dataclass(frozen=True)
class DcgmResult:
    category: str
    test: str
    #: "GPU3", a CSV of GPUs for DCGM 3.x deployment tests (one result for all GPUs), or another entity
    subject: str
    #: pass | fail | warn | skip | notrun
    status: str
    warnings: tuple[DcgmWarning, ...] = ()
    info: tuple[str, ...] = ()


@dataclass
class DcgmDiag:
    version: str | None = None
    driver: str | None = None
    results: list[DcgmResult] = field(default_factory=list)
    runtime_error: str | None = None
    #: serial numbers by subject ("GPU0" -> serial), where DCGM 4.x lists them
    serials: dict[str, str] = field(default_factory=dict)


def _remedy(result: DcgmResult, level: int, node: str) -> tuple[str, bool]:
    """(remedy, drains the node)."""
    severities = {w.severity_name for w in result.warnings if w.severity is not None}
    rerun = f"`dcgmi diag -r {level}` on {node} after the fix (inferctl check gpu --diag {level} -n {node})"
    if severities & DRAIN_SEVERITIES or (not severities and result.category.lower() != "deployment"):
        return (f"drain the node: DCGM says the GPU cannot run workloads ({result.test}); reset the GPU "
                f"(`nvidia-smi -r`) or reboot, rerun {rerun}; open an RMA with the serial number if it fails again"), True
    if "triage" in severities:
        return f"triage: run a field diagnostic (dcgmi diag -r 4) and check the kernel log, then rerun {rerun}", False
    if "config" in severities:
        return f"a configuration DCGM flags (see the warning); fix it, then rerun {rerun}", False
    if "monitor" in severities:
        return "DCGM says the GPU can run workloads but should be watched: keep it in service, check this " \
               "finding's trend in the audits", False
    return f"fix what the warning names (driver, libraries, permissions, environment), then rerun {rerun}", False


def judge_dcgm(node: str, diag: DcgmDiag | None, level: int, error: str | None = None) -> list[Finding]:
    """One `gpu.diag` finding per (test, subject); UNKNOWN when dcgmi did not run or said nothing."""
    if diag is None or diag.runtime_error:
        why = (diag.runtime_error.strip() if diag is not None and diag.runtime_error else error) or "no output"
        return [Finding.unknown(
            "gpu.diag", node, "node", f"dcgmi diag -r {level} did not run: {why}",
            details={"level": level, "version": diag.version if diag else None},
            remedy="install DCGM (datacenter-gpu-manager) and start its host engine (`systemctl start "
                   "nvidia-dcgm` or `nv-hostengine`); stop workloads holding the GPUs; see /var/log/nvidia-dcgm/")]
    if not diag.results:
        return [Finding.unknown("gpu.diag", node, "node", f"dcgmi diag -r {level} reported no test results",
                                details={"level": level, "version": diag.version},
                                remedy="rerun with `dcgmi diag -r N -j -v` on the node and read nv-hostengine.log")]
    out = []
    for r in diag.results:
        details = {"level": level, "category": r.category, "test": r.test, "dcgm_status": r.status,
                   "warnings": [{"message": w.message, "error_id": w.error_id, "category": w.category,
                                 "severity": w.severity_name} for w in r.warnings],
                   "info": list(r.info), "dcgm_version": diag.version, "driver": diag.driver,
                   "serial": diag.serials.get(r.subject)}
        first = r.warnings[0].message if r.warnings else (r.info[0] if r.info else "")
        text = f"{r.test} ({r.category}, level {level}): {r.status}" + (f": {first}" if first else "")
        if r.status == "pass":
            out.append(Finding.ok("gpu.diag", node, r.subject, text, details=details))
        elif r.status in ("skip", "notrun"):
            out.append(Finding.skip("gpu.diag", node, r.subject, text, details=details))
        else:
            remedy, drains = _remedy(r, level, node)
            if drains:
                details["action"] = "drain"
            status = Status.FAIL if r.status == "fail" else Status.WARN
            out.append(Finding.make(status, "gpu.diag", node, r.subject, text, details=details, remedy=remedy))
    return out

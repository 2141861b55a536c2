"""Stable finding codes: one short code per check id, for tickets, alert routing and runbooks.

Like NHC/aznhc's codes (aznhc's `NHC2007` ...), a code names *what was checked*, not its outcome: the
status travels next to it. The scheme is `IC-<AREA>-<NNN>`: IC = inferctl, AREA = the check id's first
part (GPU, FAB fabric, SRV servers, TOK tokenizer, LCH launch/status/stop, PRF profile, PLN plan, SPC speculative
decoding, RMD remediation), NNN a
number assigned once. `NNN = 000` is the area's "the checks did not run" (`<family>.internal`).

Rules (tests/audit/test_finding_codes.py holds them): a code is never reused or renumbered, also after
its check id is retired (keep the row); every check id the code can produce has a row here and in the
table of docs/runbooks/cron-audit.md; no two check ids share a code.
"""

from __future__ import annotations

CODES: dict[str, str] = {
    # ---- gpu ------------------------------------------------------------------------------------
    "gpu.internal": "IC-GPU-000",
    "gpu.facts": "IC-GPU-001",
    "gpu.driver": "IC-GPU-002",
    "gpu.count": "IC-GPU-003",
    "gpu.driver_consistency": "IC-GPU-004",
    "gpu.nvml": "IC-GPU-005",
    "gpu.persistence": "IC-GPU-006",
    "gpu.ecc_mode": "IC-GPU-007",
    "gpu.ecc_errors": "IC-GPU-008",
    "gpu.row_remap": "IC-GPU-009",
    "gpu.retired_pages": "IC-GPU-010",
    "gpu.recovery_action": "IC-GPU-011",
    "gpu.temperature": "IC-GPU-012",
    "gpu.throttle": "IC-GPU-013",
    "gpu.pcie": "IC-GPU-014",
    "gpu.nvlink": "IC-GPU-015",
    "gpu.mig": "IC-GPU-016",
    "gpu.stray_memory": "IC-GPU-017",
    "gpu.xid": "IC-GPU-018",
    "gpu.fabric": "IC-GPU-019",
    "gpu.power_limit": "IC-GPU-020",
    "gpu.pcie_replay": "IC-GPU-021",
    "gpu.memory_temp": "IC-GPU-022",
    "gpu.vbios": "IC-GPU-023",
    "gpu.vbios_consistency": "IC-GPU-024",
    "gpu.sxid": "IC-GPU-025",
    "gpu.inforom": "IC-GPU-026",
    "gpu.diag": "IC-GPU-027",
    "gpu.nvlink_rate": "IC-GPU-028",
    # ---- fabric ---------------------------------------------------------------------------------
    "fabric.internal": "IC-FAB-000",
    "fabric.node": "IC-FAB-001",
    "fabric.devices": "IC-FAB-002",
    "fabric.port_state": "IC-FAB-003",
    "fabric.rate": "IC-FAB-004",
    "fabric.link_layer": "IC-FAB-005",
    "fabric.mtu": "IC-FAB-006",
    "fabric.gid": "IC-FAB-007",
    "fabric.netdev": "IC-FAB-008",
    "fabric.netdev_mtu": "IC-FAB-009",
    "fabric.pfc": "IC-FAB-010",
    "fabric.trust": "IC-FAB-011",
    "fabric.ecn": "IC-FAB-012",
    "fabric.pause": "IC-FAB-013",
    "fabric.pfc_pauses": "IC-FAB-014",
    "fabric.counters": "IC-FAB-015",
    "fabric.sglang_ib_device": "IC-FAB-016",
    "fabric.gid_family": "IC-FAB-017",
    "fabric.pingpong": "IC-FAB-018",
    "fabric.write_lat": "IC-FAB-019",
    "fabric.write_bw": "IC-FAB-020",
    "fabric.nic_pcie": "IC-FAB-021",
    "fabric.gdr": "IC-FAB-022",
    "fabric.nccl": "IC-FAB-023",
    "fabric.link_flaps": "IC-FAB-024",
    # ---- servers --------------------------------------------------------------------------------
    "servers.internal": "IC-SRV-000",
    "servers.deployed": "IC-SRV-001",
    "servers.health": "IC-SRV-002",
    "servers.bootstrap": "IC-SRV-003",
    "servers.drift": "IC-SRV-004",
    "servers.pd_agreement": "IC-SRV-005",
    "servers.queues": "IC-SRV-006",
    "servers.start_limit": "IC-SRV-007",
    "servers.hicache_host": "IC-SRV-008",
    "servers.hicache_storage": "IC-SRV-009",
    "servers.hicache_backup": "IC-SRV-010",
    "servers.files": "IC-SRV-011",
    "servers.restart_pending": "IC-SRV-012",
    # ---- tokenizer ------------------------------------------------------------------------------
    "tokenizer.internal": "IC-TOK-000",
    "tokenizer.profile": "IC-TOK-001",
    "tokenizer.fleet": "IC-TOK-002",
    "tokenizer.files": "IC-TOK-003",
    "tokenizer.model": "IC-TOK-004",
    "tokenizer.vocab": "IC-TOK-005",
    "tokenizer.vocab_size": "IC-TOK-006",
    "tokenizer.vocab_map": "IC-TOK-007",
    "tokenizer.merges": "IC-TOK-008",
    "tokenizer.added_tokens": "IC-TOK-009",
    "tokenizer.special_ids": "IC-TOK-010",
    "tokenizer.config": "IC-TOK-011",
    "tokenizer.config_ids": "IC-TOK-012",
    "tokenizer.generation_eos": "IC-TOK-013",
    "tokenizer.padding": "IC-TOK-014",
    "tokenizer.chat_template": "IC-TOK-015",
    "tokenizer.decode": "IC-TOK-016",
    "tokenizer.probes": "IC-TOK-017",
    # ---- launch, status, stop -------------------------------------------------------------------
    "launch.args": "IC-LCH-001",
    "launch.bootstrap_port": "IC-LCH-002",
    "launch.host": "IC-LCH-003",
    "launch.ib_device": "IC-LCH-004",
    "launch.kv_events": "IC-LCH-005",
    "launch.override": "IC-LCH-006",
    "launch.pd_agreement": "IC-LCH-007",
    "launch.role": "IC-LCH-008",
    "launch.spec": "IC-LCH-009",
    "launch.gid_index": "IC-LCH-010",
    "launch.lock": "IC-LCH-011",
    "launch.port_in_use": "IC-LCH-012",
    "launch.ready": "IC-LCH-013",
    "launch.refused": "IC-LCH-014",
    "launch.rolling": "IC-LCH-015",
    "launch.router": "IC-LCH-016",
    "launch.sglang_parser": "IC-LCH-017",
    "launch.start": "IC-LCH-018",
    "launch.hicache": "IC-LCH-019",
    "launch.kv_page": "IC-LCH-020",
    "status.instance": "IC-LCH-101",
    "status.start_limit": "IC-LCH-102",
    "stop.forced": "IC-LCH-201",
    "stop.port_in_use": "IC-LCH-202",
    "stop.stray": "IC-LCH-203",
    # ---- profile, plan --------------------------------------------------------------------------
    "profile.schema": "IC-PRF-001",
    "plan.tiers.host_fit": "IC-PLN-001",
    "plan.tiers.host_small": "IC-PLN-002",
    "plan.tiers.ranks_per_host": "IC-PLN-003",
    # ---- speculative decoding -------------------------------------------------------------------
    "spec.internal": "IC-SPC-000",
    "spec.acceptance": "IC-SPC-001",
    "spec.source": "IC-SPC-002",
    # ---- remediation (audit --remediate) --------------------------------------------------------
    "remediation.drain": "IC-RMD-001",
    "remediation.held": "IC-RMD-002",
    "remediation.router": "IC-RMD-003",
    "remediation.recovery": "IC-RMD-004",
    "remediation.returned": "IC-RMD-005",
    "remediation.hook": "IC-RMD-006",
}


def code_for(check: str) -> str | None:
    """The stable code of a check id; None for an id without a row (a test keeps that from shipping)."""
    return CODES.get(check)

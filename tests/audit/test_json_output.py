"""The --json document of a large audit: written by orjson (output/json_doc.py) and equal to what the
stdlib encoder wrote before, as JSON and as text (a report holds no exponent-notation floats)."""

from __future__ import annotations

import json
from pathlib import Path

from infer_ctl.core.gpu import rules
from infer_ctl.core.gpu.facts import NodeGpuFacts
from infer_ctl.core.report import Report
from infer_ctl.facts.nvidia_smi import parse_nvidia_smi_xml
from infer_ctl.output import json_doc
from infer_ctl.profile.gpu import GpuPolicy

QX = Path(__file__).parents[1] / "fixtures" / "nvidia-smi-qx"


def _big_report() -> Report:
    doc = parse_nvidia_smi_xml((QX / "HAND-EDITED-h100x8-580.105.08-fabric-power-hbm-vbios.xml").read_text())
    facts = NodeGpuFacts(source="nvidia-smi", driver_version=doc.driver_version, cuda_version=doc.cuda_version,
                         gpu_count=8, gpus=doc.gpus, xids=(), sxids=(), boot_time=1.8e9, gathered_at=1.8e9 + 60)
    findings = [f for i in range(16) for f in rules.judge_node(f"node-{i:02d}", facts, GpuPolicy(), 8)]
    return Report("audit", "p", findings=findings, data={"nodes": [f"node-{i:02d}" for i in range(16)], "ü": "\u2713"})


def test_json_document_is_the_same_as_the_stdlib_wrote() -> None:
    doc = _big_report().to_dict()
    assert json_doc._orjson is not None  # a dependency: the fast path is taken
    text = json_doc.dumps(doc)
    assert text == json.dumps(doc, indent=2, sort_keys=False, default=str, ensure_ascii=False)


def test_values_orjson_refuses_fall_back_to_the_stdlib() -> None:
    doc = {"big": 2**70, ("a", 1): "tuple key"}
    try:
        json.dumps(doc)
    except TypeError:
        doc.pop(("a", 1))
    assert json.loads(json_doc.dumps(doc)) == {"big": 2**70}

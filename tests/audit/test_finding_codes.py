"""Stable finding codes: every check id the code can produce has one, documented in the runbook, and no
two check ids share one (core/finding_codes.py)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from infer_ctl.checks.family_names import FAMILY_NAMES
from infer_ctl.core.finding_codes import CODES, code_for
from infer_ctl.core.findings import Finding
from infer_ctl.core.promtext import findings_families, render

ROOT = Path(__file__).resolve().parents[2]
RUNBOOK = ROOT / "docs" / "runbooks" / "cron-audit.md"
CODE = re.compile(r"^IC-[A-Z]{3}-\d{3}$")
CHECK_ID = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")
STATUSES = {"ok", "warn", "fail", "unknown", "skip"}
#: string constants shaped like a check id that are something else
NOT_CHECK_IDS = {"tokenizer.json"}  # the file name


def _finding_aliases(tree: ast.Module) -> set[str]:
    """Names bound to Finding.<status> (`status = Finding.fail if lost else Finding.warn`)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            attrs = [n for n in ast.walk(node.value) if isinstance(n, ast.Attribute)]
            if attrs and all(isinstance(a.value, ast.Name) and a.value.id == "Finding" and a.attr in STATUSES
                             for a in attrs):
                names.add(node.targets[0].id)
    return names


def _string_values(tree: ast.Module, name: str) -> set[str]:
    """Every string a name is assigned anywhere in the module (module constants and locals like
    `check = "tokenizer.config_ids"`), and the values of a dict constant of that name."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets) and node.value is not None:
                if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                    out.add(node.value.value)
                elif isinstance(node.value, ast.Dict):
                    out |= {v.value for v in node.value.values if isinstance(v, ast.Constant) and isinstance(v.value, str)}
    return out


def _resolve(expr: ast.expr | None, tree: ast.Module) -> set[str] | None:
    """The check ids an argument expression can take; None when it cannot be told from the source."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return {expr.value}
    if isinstance(expr, ast.Name):
        return _string_values(tree, expr.id) or None
    if isinstance(expr, ast.BoolOp):
        parts = [_resolve(v, tree) for v in expr.values]
        known = set().union(*(p for p in parts if p))
        return known or None
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "get" \
            and isinstance(expr.func.value, ast.Name):  # CHECK_BY_TOOL.get(tool, "fabric.pingpong")
        found = _string_values(tree, expr.func.value.id)
        for arg in expr.args[1:]:
            found |= _resolve(arg, tree) or set()
        return found or None
    if isinstance(expr, ast.JoinedStr) and ast.unparse(expr) == "f'{family.name}.internal'":
        return {f"{name}.internal" for name in FAMILY_NAMES}
    return None


def _check_arg(call: ast.Call, aliases: set[str]) -> tuple[bool, ast.expr | None]:
    f = call.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "Finding":
        if f.attr in STATUSES:
            return True, call.args[0] if call.args else None
        if f.attr == "make":
            return True, call.args[1] if len(call.args) > 1 else None
    if isinstance(f, ast.Name) and (f.id == "Finding" or f.id in aliases):
        kw = {k.arg: k.value for k in call.keywords}
        return True, kw.get("check") or (call.args[0] if call.args else None)
    return False, None


def _pass_through(expr: ast.expr | None, tree: ast.Module) -> bool:
    """A check id handed on, not made here: another finding's (`f.check`, re-emitted with a new message)
    or a function parameter (its callers' constants are scanned where they are written)."""
    if isinstance(expr, ast.Attribute) and expr.attr == "check":
        return True
    if isinstance(expr, ast.Name):
        params = {a.arg for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
                  for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]}
        return expr.id in params
    return False


def check_ids_in_code() -> tuple[set[str], list[str]]:
    """(check ids, call sites whose id cannot be told from the source)."""
    ids: set[str] = set()
    unresolved: list[str] = []
    prefixes = {c.split(".", 1)[0] for c in CODES}
    for path in sorted((ROOT / "infer_ctl").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases = _finding_aliases(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                is_finding, arg = _check_arg(node, aliases)
                if is_finding:
                    values = _resolve(arg, tree)
                    if values is None and _pass_through(arg, tree):
                        continue
                    if values is None:
                        unresolved.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(arg) if arg else '?'}")
                    else:
                        ids |= values
            # ids built away from the Finding call (launch's refusal reasons, ...): any constant of
            # a known area that looks like a check id
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and CHECK_ID.match(node.value) \
                    and node.value.split(".", 1)[0] in prefixes and node.value not in NOT_CHECK_IDS:
                ids.add(node.value)
    return ids, unresolved


def _documented() -> dict[str, str]:
    rows = re.findall(r"^\| `(IC-[A-Z]{3}-\d{3})` \| `([a-z0-9_.]+)` \|", RUNBOOK.read_text(encoding="utf-8"), re.M)
    assert rows, "the runbook has no finding code table"
    table: dict[str, str] = {}
    for code, check in rows:
        assert check not in table, f"{check} is documented twice"
        table[check] = code
    return table


def test_every_check_id_in_the_code_has_a_code() -> None:
    ids, unresolved = check_ids_in_code()
    assert unresolved == [], "call sites whose check id the scan cannot tell: name it with a constant"
    assert "gpu.xid" in ids and "fabric.write_bw" in ids and "gpu.internal" in ids  # the scan sees them
    missing = sorted(i for i in ids if i not in CODES)
    assert missing == [], f"check ids without a code in core/finding_codes.py: {missing}"


def test_codes_are_well_formed_and_never_collide() -> None:
    assert all(CODE.match(c) for c in CODES.values()), [c for c in CODES.values() if not CODE.match(c)]
    assert len(set(CODES.values())) == len(CODES)
    assert all(CHECK_ID.match(k) for k in CODES)


def test_every_code_is_documented_in_the_runbook() -> None:
    assert _documented() == CODES


def test_the_code_travels_in_json_and_in_the_textfile() -> None:
    f = Finding.fail("gpu.xid", "pf-01", "GPU3", "XID 79")
    assert f.code == code_for("gpu.xid") == "IC-GPU-018"
    assert f.to_dict()["code"] == "IC-GPU-018"
    text = render(findings_families([f], run_timestamp=1.0, duration_s=0.1))
    assert 'inferctl_check_status{check="gpu.xid",code="IC-GPU-018",node="pf-01",subject="GPU3"} 2' in text

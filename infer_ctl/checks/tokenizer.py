"""`check tokenizer`: load the target and draft directories, judge them with core.tokenizer, and (fleet
mode) prove every serving node holds the same bytes.

Local mode reads two directories on this machine. Fleet mode asks each selected node only for sha256
sums of the tokenizer files (a few hundred bytes per node), then runs the full comparison once: on the
local copy when this machine has the same bytes, otherwise on the files fetched from one node.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from infer_ctl.checks.registry import AuditContext, CheckFamily
from infer_ctl.core.findings import Finding, Status
from infer_ctl.core.tokenizer import compare_tokenizers
from infer_ctl.core.tokenizer.model import Encoder
from infer_ctl.errors import InferctlError, MissingExtraError, UsageError
from infer_ctl.facts.tokenizer.directory import LoadedSide, load_tokenizer_dir
from infer_ctl.facts.tokenizer.encoder import TokenizerLoadError, build_encoder, require_tokenizers
from infer_ctl.facts.tokenizer.files import TOKENIZER_FILES
from infer_ctl.facts.tokenizer.hashes import local_hashes, parse_sha256sum, tokenizer_hash_command
from infer_ctl.profile import Node, Profile, load_profile
from infer_ctl.remote.base import Connector

if TYPE_CHECKING:
    from infer_ctl.remote.fleet import Fleet

FLEET_CHECK = "tokenizer.fleet"
PROFILE_CHECK = "tokenizer.profile"
# Algorithms whose draft is not a separate model with its own files.
_NO_DRAFT_FILES = {"NEXTN", "NGRAM"}


def load_probe_file(path: str | Path) -> list[str]:
    """--probes FILE: a JSON list of strings, or plain text with one probe per line (blank lines skipped)."""
    file = Path(path).expanduser()
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--probes {path}: cannot read it: {exc}",
                         remedy="pass a UTF-8 text file (one probe per line) or a JSON list of strings") from exc
    if file.suffix == ".json":
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise UsageError(f"--probes {path}: not valid JSON: {exc}",
                             remedy="write a JSON list of strings, e.g. [\"a <|eot_id|>\", \"x\"]") from exc
        if not isinstance(doc, list) or not all(isinstance(x, str) for x in doc):
            raise UsageError(f"--probes {path}: expected a JSON list of strings",
                             remedy="write a JSON list of strings, e.g. [\"a <|eot_id|>\", \"x\"]")
        return doc
    return [line for line in text.splitlines() if line.strip()]


def _require_dir(path: str | Path, what: str) -> Path:
    directory = Path(path).expanduser()
    if not directory.is_dir():
        raise UsageError(f"{what} {path}: no such directory",
                         remedy=f"pass the local directory that holds the {what.lstrip('-')} model's tokenizer files")
    return directory


def compare_dirs(target_dir: str | Path, draft_dir: str | Path, *, probes: Sequence[str] = (),
                 probes_name: str = "user probes", node: str = "local") -> list[Finding]:
    """The full local comparison of two directories (both must exist)."""
    target = load_tokenizer_dir(target_dir, "target")
    draft = load_tokenizer_dir(draft_dir, "draft")
    target, enc_t = _encoder(target)
    # Byte-identical tokenizer.json behaves identically under one library: load it once (half the time).
    same = draft.tokenizer_json is not None and draft.tokenizer_json == target.tokenizer_json
    draft, enc_d = (draft, enc_t) if same and enc_t is not None else _encoder(draft)
    return compare_tokenizers(target.facts, draft.facts, target_encoder=enc_t, draft_encoder=enc_d,
                              user_probes=probes, user_probes_name=probes_name, node=node)


def _encoder(side: LoadedSide) -> tuple[LoadedSide, Encoder | None]:
    """The side's encoder; a tokenizer.json the library refuses becomes one of the side's file problems
    (reported as tokenizer.files; the structure comparison and probes are then skipped)."""
    try:
        return side, build_encoder(side)
    except TokenizerLoadError as exc:
        problems = {**side.facts.problems, "tokenizer.json": exc.reason}
        return replace(side, facts=replace(side.facts, problems=problems)), None


# ---------------------------------------------------------------- the pair named by the profile


@dataclass(frozen=True)
class ProfilePair:
    target: str
    draft: str | None
    #: why there is nothing to compare (no models section, NGRAM/NEXTN draft), or None
    reason: str | None = None


def profile_pair(profile: Profile) -> ProfilePair:
    """The model paths as the profile writes them ("~/..." stays home-relative: on a node it is that node's
    home); relative paths are resolved against the profile's directory."""
    models = profile.models
    if models is None:
        return ProfilePair("", None, "the profile has no models section")
    base = profile.base_dir

    def resolve(path: str) -> str:
        return path if path.startswith("~") or Path(path).is_absolute() else str(base / path)

    target = resolve(models.target.tokenizer_path or models.target.path)
    draft = models.draft
    if draft is None:
        return ProfilePair(target, None, "the profile has no draft model (no speculative decoding)")
    if draft.path is None or draft.algorithm.value in _NO_DRAFT_FILES:
        return ProfilePair(target, None, f"the {draft.algorithm.value} draft has no files of its own; "
                           "it uses the target's tokenizer by construction")
    return ProfilePair(target, resolve(draft.path))


def local_path(path: str) -> Path:
    return Path(path).expanduser()


def check_profile_local(profile: Profile, *, probes: Sequence[str] = (), probes_name: str = "user probes",
                        missing: Status = Status.UNKNOWN) -> list[Finding]:
    """Compare the profile's pair on this machine; `missing` is the status when the paths are not here."""
    pair = profile_pair(profile)
    if pair.draft is None:
        return [Finding.skip(PROFILE_CHECK, "local", "models", f"nothing to compare: {pair.reason}")]
    absent = [p for p in (pair.target, pair.draft) if not local_path(p).is_dir()]
    if absent:
        return [Finding.make(
            missing, PROFILE_CHECK, "local", "models",
            f"tokenizer parity not checked here: {', '.join(absent)} {'is' if len(absent) == 1 else 'are'} not "
            "a directory on this machine (model files are read locally, never downloaded)",
            details={"target": pair.target, "draft": pair.draft},
            remedy="run `inferctl check tokenizer --fleet` to check the copies on the serving nodes, or pass "
            "--target DIR --draft DIR with local copies")]
    return compare_dirs(local_path(pair.target), local_path(pair.draft), probes=probes, probes_name=probes_name)


# ---------------------------------------------------------------- fleet mode


@dataclass(frozen=True)
class NodeHashes:
    hashes: dict[str, dict[str, str] | None]  # side -> {file: sha256} (None: no such directory)


def gather_hashes(conn: Connector, node: Node, dirs: dict[str, str], timeout: float) -> NodeHashes:
    out: dict[str, dict[str, str] | None] = {}
    for side, directory in dirs.items():
        result = conn.run(tokenizer_hash_command(directory), timeout=timeout)
        if not result.ok:
            raise InferctlError(
                f"hashing {directory} failed: {result.err.strip() or f'exit {result.exit_code}'}",
                remedy="check that sha256sum (coreutils) is installed and the files are readable by the SSH user",
                exit_code=3)
        out[side] = parse_sha256sum(result.out)
    return NodeHashes(out)


@dataclass(frozen=True)
class Reference:
    """The copy of one side most nodes hold (ties: the first in profile order), and who holds it."""

    hashes: dict[str, str]
    node: str
    holders: int


def majority_reference(per_node: dict[str, NodeHashes | InferctlError], side: str) -> Reference | None:
    copies = [(node, got.hashes[side]) for node, got in per_node.items()
              if isinstance(got, NodeHashes) and got.hashes.get(side) is not None]
    if not copies:
        return None
    counts = Counter(json.dumps(h, sort_keys=True) for _, h in copies)
    best = max(counts.values())
    node, hashes = next((n, h) for n, h in copies if counts[json.dumps(h, sort_keys=True)] == best)
    assert hashes is not None
    return Reference(hashes, node, best)


def judge_fleet_hashes(dirs: dict[str, str], per_node: dict[str, NodeHashes | InferctlError],
                       reference: dict[str, Reference | None]) -> list[Finding]:
    """Each node's tokenizer files against the majority copy of each side."""
    findings: list[Finding] = []
    for node, got in per_node.items():
        if isinstance(got, InferctlError):
            findings.append(Finding.unknown(FLEET_CHECK, node, "tokenizer files", f"could not hash: {got.message}",
                                            remedy=got.remedy or "check the node is reachable (`inferctl nodes`)"))
            continue
        for side, directory in dirs.items():
            ref, have = reference.get(side), got.hashes.get(side)
            if have is None:
                findings.append(Finding.fail(FLEET_CHECK, node, side, f"{directory} does not exist on this node",
                                             remedy=f"copy the {side} model to {directory} on {node}"))
                continue
            if ref is None:
                continue
            differ = sorted(n for n in set(ref.hashes) | set(have) if ref.hashes.get(n) != have.get(n))
            if differ:
                first = differ[0]
                state = ("missing here" if first not in have else
                         "only here" if first not in ref.hashes else "different bytes")
                findings.append(Finding.fail(
                    FLEET_CHECK, node, side,
                    f"{len(differ)} tokenizer file(s) differ from the copy on {ref.node} "
                    f"(held by {ref.holders} node(s)); first: {first} ({state})",
                    details={"files": {n: {"node": have.get(n), "reference": ref.hashes.get(n)} for n in differ},
                             "reference_node": ref.node},
                    remedy=f"re-sync {directory} on {node} from {ref.node} (rsync -c), then rerun"))
            else:
                findings.append(Finding.ok(FLEET_CHECK, node, side,
                                           f"{len(have)} tokenizer files identical to the reference copy",
                                           details={"sha256": have}))
    return findings


def fetch_copy(conn: Connector, directory: str, names: Sequence[str], into: Path) -> Path:
    """Only the hashed tokenizer files (a few MB), never weights; "~/x" is fetched as x, relative to the
    login directory where SFTP and shells start."""
    into.mkdir(parents=True)
    remote = directory[2:] if directory.startswith("~/") else directory
    for name in names:
        (into / name).write_bytes(conn.get_file(f"{remote.rstrip('/')}/{name}"))
    return into


def check_fleet(profile: Profile, fleet: Fleet, nodes: Sequence[Node], *, probes: Sequence[str] = (),
                probes_name: str = "user probes") -> list[Finding]:
    pair = profile_pair(profile)
    if pair.draft is None:
        return [Finding.skip(PROFILE_CHECK, "local", "models", f"nothing to compare: {pair.reason}")]
    dirs = {"target": pair.target, "draft": pair.draft}
    timeout = profile.ssh.command_timeout_s
    outcomes = fleet.map(nodes, lambda conn, node: gather_hashes(conn, node, dirs, timeout))
    per_node: dict[str, NodeHashes | InferctlError] = {}
    for o in outcomes:  # gather_hashes returns a value or raises: an outcome holds one of the two
        if o.error is not None:
            per_node[o.node.name] = o.error
        elif o.value is not None:
            per_node[o.node.name] = o.value
    reference = {side: majority_reference(per_node, side) for side in dirs}
    findings = judge_fleet_hashes(dirs, per_node, reference)
    if any(ref is None for ref in reference.values()):
        findings.append(Finding.unknown(
            PROFILE_CHECK, "fleet", "models",
            "no reachable node holds both model directories, so there is no copy to compare",
            remedy="fix the node findings above, then rerun"))
        return findings
    by_name = {n.name: n for n in nodes}
    with tempfile.TemporaryDirectory(prefix="inferctl-tokenizer-") as tmp:
        local_dirs: dict[str, Path] = {}
        where: list[str] = []
        for side, directory in dirs.items():
            ref = reference[side]
            assert ref is not None
            # This machine's copy saves the download when it is byte-identical to the one being served.
            if local_hashes(local_path(directory)) == ref.hashes:
                local_dirs[side] = local_path(directory)
                where.append("local")
            else:
                conn = fleet.connector(by_name[ref.node])
                local_dirs[side] = fetch_copy(conn, directory, sorted(ref.hashes), Path(tmp) / side)
                where.append(ref.node)
        node = where[0] if where[0] == where[1] else "+".join(where)
        findings += compare_dirs(local_dirs["target"], local_dirs["draft"], probes=probes,
                                 probes_name=probes_name, node=node)
    return findings


# ---------------------------------------------------------------- what the command runs


def run_check_tokenizer(*, target: str | None, draft: str | None, probes_file: str | None, fleet: bool,
                        profile_path: str | None, nodes: str | None = None,
                        role: str | None = None) -> tuple[list[Finding], str | None]:
    """Findings and the profile name (None when --target/--draft made a profile unnecessary)."""
    if (target is None) != (draft is None):
        raise UsageError("--target and --draft go together",
                         remedy="pass both directories, or neither to use the profile's models section")
    if fleet and target is not None:
        raise UsageError("--fleet checks the profile's model paths on the nodes; it takes no --target/--draft",
                         remedy="drop --target/--draft, or drop --fleet to compare two local directories")
    if not fleet and (nodes or role):
        raise UsageError("--nodes/--role select the nodes of --fleet mode",
                         remedy="add --fleet to check the tokenizer files on those nodes")
    probes = load_probe_file(probes_file) if probes_file else []
    probes_name = f"probes from {Path(probes_file).name}" if probes_file else "user probes"
    if target is not None and draft is not None:
        require_tokenizers()
        findings = compare_dirs(_require_dir(target, "--target"), _require_dir(draft, "--draft"),
                                probes=probes, probes_name=probes_name)
        return findings, None
    profile = load_profile(profile_path)
    require_tokenizers()
    if not fleet:
        return check_profile_local(profile, probes=probes, probes_name=probes_name), profile.name
    # imported here: only fleet mode needs the SSH stack (paramiko), local comparisons stay light
    from infer_ctl.profile.select import select_nodes
    from infer_ctl.remote.fleet import Fleet

    selected = select_nodes(profile, nodes, role)
    with Fleet(profile) as opened:
        return check_fleet(profile, opened, selected, probes=probes, probes_name=probes_name), profile.name


# ---------------------------------------------------------------- audit family


def _audit(ctx: AuditContext) -> list[Finding]:
    # Paths first: a controller without model copies skips cleanly even without the tokenizers extra.
    try:
        return check_profile_local(ctx.profile, missing=Status.SKIP)
    except MissingExtraError as exc:
        return [Finding.unknown(PROFILE_CHECK, "local", "models", exc.message, remedy=exc.remedy)]


FAMILY = CheckFamily(
    name="tokenizer",
    description="draft/target tokenizer parity (runs when the profile's model paths are local directories)",
    run=_audit,
    needs_nodes=False,
)


__all__ = [
    "FAMILY",
    "TOKENIZER_FILES",
    "check_fleet",
    "check_profile_local",
    "compare_dirs",
    "load_probe_file",
    "run_check_tokenizer",
]

"""Problems to report before launch, judged on the EFFECTIVE command lines (after extra args).

SGLang silently rewrites some inconsistent settings (topk 1 with num_draft_tokens != num_steps + 1),
asserts on others at start-up (minutes into a model load), and some mistakes only show as failed
transfers (prefill and decode disagreeing on the model or the speculative setup). All are judged here
from the rendered argv, so they hold whatever the extra args did.
"""

from __future__ import annotations

import ipaddress
import json
import re

from infer_ctl.core.findings import Finding
from infer_ctl.core.sglang.antipatterns import antipattern_findings, extra_args_source
from infer_ctl.core.sglang.argv import build_argv, parse_extra_args, server_args, visible_device_map
from infer_ctl.core.sglang.contradictions import contradiction_findings, override_finding
from infer_ctl.core.sglang.flags import flag_table
from infer_ctl.core.sglang.hicache_rules import hicache_findings
from infer_ctl.core.sglang.instance import Instance, instances
from infer_ctl.core.spec.pools import decode_steps_may_differ, server_override
from infer_ctl.profile import Profile

#: settings prefill and decode must agree on (SGLang: "launch P and D with the same spec flags"). Page
#: size and KV cache dtype: the decode raises "Page size mismatch" / "KV cache dtype mismatch" at its
#: first transfer when the prefill's bootstrap info differs (SGLang 0.5.23
#: sglang/srt/disaggregation/common/conn.py, the sanity checks after fetching the prefill's info).
PD_AGREEMENT = (
    "--model-path",
    "--disaggregation-transfer-backend",
    "--page-size",
    "--kv-cache-dtype",
    "--speculative-algorithm",
    "--speculative-draft-model-path",
    "--speculative-num-steps",
    "--speculative-eagle-topk",
    "--speculative-num-draft-tokens",
)
#: extra args that would make a server something other than what launch, the router and the decodes
#: take it for: refused (FAIL), not merely reported as an override
ROLE_FLAG = "--disaggregation-mode"
BOOTSTRAP_FLAG = "--disaggregation-bootstrap-port"
_SPEC_NUMBERS = ("--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens")


def effective_args(argv: list[str]) -> dict[str, str | None]:
    """Canonical flag -> value (None for switches); the last occurrence wins, as in argparse."""
    table = flag_table()
    result: dict[str, str | None] = {}
    for opt in parse_extra_args(server_args(argv)):
        spec = table.lookup(opt.flag)
        result[spec.canonical if spec else opt.flag] = opt.value
    return result


def _flag_findings(inst: Instance, argv: list[str]) -> list[Finding]:
    table = flag_table()
    out: list[Finding] = []
    for opt in parse_extra_args(server_args(argv)):
        if not opt.flag.startswith("-"):
            continue
        spec = table.lookup(opt.flag)
        if spec is None:
            near = table.candidates(opt.flag)
            hint = f"it is ambiguous between {', '.join(near)}" if near else "SGLang 0.5.23 has no such flag"
            out.append(
                Finding.fail(
                    "launch.args",
                    inst.node,
                    inst.name,
                    f"{opt.flag}: {hint}",
                    details={"flag": opt.flag, "candidates": near},
                    remedy="fix the flag in sglang.extra_args / nodes[].overrides.extra_args "
                    "(see `python -m sglang.launch_server --help`)",
                )
            )
        elif spec.choices and opt.value is not None and opt.value not in spec.choices:
            out.append(
                Finding.fail(
                    "launch.args",
                    inst.node,
                    inst.name,
                    f"{opt.flag} {opt.value}: not one of {', '.join(spec.choices)}",
                    remedy=f"choose one of {', '.join(spec.choices)}",
                )
            )
    return out


def _int(v: str | None) -> int | None:
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def _spec_findings(inst: Instance, args: dict[str, str | None]) -> list[Finding]:
    return _role_switch_spec_findings(inst, args) + _spec_number_findings(inst, args)


def _role_switch_spec_findings(inst: Instance, args: dict[str, str | None]) -> list[Finding]:
    """SGLang refuses the role switch with any algorithm (NGRAM too), whatever the numbers; judged on its
    own (it was the last branch of the numbers' checks: unset numbers or another finding there hid it)."""
    algo = (args.get("--speculative-algorithm") or "").upper()
    if algo and "--enable-pd-role-switch" in args:
        return [
            Finding.fail(
                "launch.spec",
                inst.node,
                inst.name,
                f"--enable-pd-role-switch cannot be combined with speculative decoding ({algo})",
                remedy="drop --speculative-algorithm from the extra args, or set sglang.pd_role_switch: false "
                "(and drop --enable-pd-role-switch from the extra args)",
            )
        ]
    return []


def _spec_number_findings(inst: Instance, args: dict[str, str | None]) -> list[Finding]:
    algo = (args.get("--speculative-algorithm") or "").upper()
    if not algo or algo == "NGRAM":
        return []
    steps, topk, ndt = (_int(args.get(f)) for f in _SPEC_NUMBERS)
    given = [f for f in _SPEC_NUMBERS if args.get(f) is not None]
    if given and len(given) != 3:
        missing = [f for f in _SPEC_NUMBERS if f not in given]
        return [
            Finding.fail(
                "launch.spec",
                inst.node,
                inst.name,
                f"speculative numbers partly set (missing {', '.join(missing)}); SGLang asserts at start-up",
                remedy="set all three of num_steps, eagle_topk, num_draft_tokens, or none of them",
            )
        ]
    out = _eagle_family_findings(inst, algo, args, topk)
    if steps is None or topk is None or ndt is None:
        return out
    if topk == 1 and ndt != steps + 1:
        out.append(
            Finding.warn(
                "launch.spec",
                inst.node,
                inst.name,
                f"eagle_topk 1 with num_draft_tokens {ndt}: SGLang silently rewrites it to "
                f"num_steps + 1 = {steps + 1}",
                details={"num_steps": steps, "eagle_topk": topk, "num_draft_tokens": ndt},
                remedy=f"set num_draft_tokens to {steps + 1} so the profile says what runs",
            )
        )
    elif ndt > topk * steps + 1:
        out.append(
            Finding.fail(
                "launch.spec",
                inst.node,
                inst.name,
                f"num_draft_tokens {ndt} exceeds the draft tree size eagle_topk*num_steps+1 = {topk * steps + 1}",
                remedy="lower num_draft_tokens or raise eagle_topk/num_steps",
            )
        )
    return out


#: algorithms SGLang 0.5.23 resolves with `_handle_eagle_family` (sglang/srt/arg_groups/
#: speculative_hook.py; NEXTN is an alias of EAGLE, STANDALONE shares the handler)
EAGLE_FAMILY = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE")
#: the only attention backends with the two-pass page-tree draft decode that eagle_topk > 1 needs at
#: page_size > 1 (`_PAGE_TREE_SPEC_BACKENDS` in `_handle_eagle_family`)
PAGE_TREE_SPEC_BACKENDS = ("flashinfer", "fa3", "triton")
#: SGLang's cap on --max-running-requests for EAGLE-family speculative decoding when it is not set
SPEC_DEFAULT_MAX_RUNNING = 48
_BACKEND_FLAGS = ("--attention-backend", "--prefill-attention-backend", "--decode-attention-backend")


def _eagle_family_findings(
    inst: Instance, algo: str, args: dict[str, str | None], topk: int | None
) -> list[Finding]:
    """SGLang 0.5.23's model-independent EAGLE rules (`_handle_eagle_family`), judged before launch
    because SGLang applies them only once the model is loading (or silently):
    - no --max-running-requests: SGLang sets 48 ("Max running requests is reset to 48 for speculative
      decoding"), a silent cap on a decode's batch;
    - eagle_topk > 1 with the trtllm_mha backend (Blackwell's default for topk 1): "trtllm_mha backend
      only supports topk = 1 for speculative decoding";
    - eagle_topk > 1 with page_size > 1 on a backend other than flashinfer/fa3/triton: "speculative_eagle_topk
      > 1 with page_size > 1 is only supported on ...". An unset backend is SGLang's per-GPU default,
      which for topk > 1 is one of those three on CUDA (`get_default_attn_backend`)."""
    if algo not in EAGLE_FAMILY:
        return []
    out: list[Finding] = []
    if args.get("--max-running-requests") is None and inst.role in ("decode", "collocated"):
        out.append(
            Finding.warn(
                "launch.spec",
                inst.node,
                inst.name,
                f"{algo} without --max-running-requests: SGLang caps it at {SPEC_DEFAULT_MAX_RUNNING} "
                "running requests for speculative decoding, silently limiting the decode batch",
                details={"flag": "--max-running-requests", "sglang_default": SPEC_DEFAULT_MAX_RUNNING},
                remedy="set --max-running-requests in sglang.extra_args (SGLang's PD example runs decodes "
                "with 128; size it to the KV pool and the CUDA-graph batch sizes)",
            )
        )
    if topk is None or topk <= 1:
        return out
    base = args.get("--attention-backend")
    backends = {f: args.get(f) or base for f in _BACKEND_FLAGS[1:]}
    if "trtllm_mha" in backends.values():
        flag = next(f for f in _BACKEND_FLAGS if args.get(f) == "trtllm_mha")
        out.append(
            Finding.fail(
                "launch.spec",
                inst.node,
                inst.name,
                f"{flag} trtllm_mha with eagle_topk {topk}: SGLang refuses it (trtllm_mha supports "
                "topk = 1 only)",
                details={"flag": flag, "eagle_topk": topk},
                remedy="set eagle_topk 1, or choose another attention backend (flashinfer, fa3, triton)",
            )
        )
    page = _int(args.get("--page-size"))
    if page is not None and page > 1 and base is not None and base not in PAGE_TREE_SPEC_BACKENDS:
        out.append(
            Finding.fail(
                "launch.spec",
                inst.node,
                inst.name,
                f"eagle_topk {topk} with --page-size {page} needs attention backend "
                f"{', '.join(PAGE_TREE_SPEC_BACKENDS)}, not {base}; SGLang refuses to start",
                details={"eagle_topk": topk, "page_size": page, "attention_backend": base},
                remedy="use --page-size 1, eagle_topk 1, or one of those attention backends",
            )
        )
    return out


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_findings(inst: Instance, args: dict[str, str | None], decode_hosts: set[str]) -> list[Finding]:
    if inst.role != "prefill":
        return []
    bind = args.get("--host") or "127.0.0.1"
    remote = {h for h in decode_hosts if h != inst.host}
    if _is_loopback(bind) and remote and not all(_is_loopback(h) for h in remote):
        return [
            Finding.fail(
                "launch.host",
                inst.node,
                inst.name,
                f"the prefill binds {bind}, so decodes on {', '.join(sorted(remote))} cannot reach its "
                "bootstrap server",
                remedy="set sglang.prefill.host to a routable address (or leave it unset for the node's address)",
            )
        ]
    return []


def _role_findings(inst: Instance, args: dict[str, str | None]) -> list[Finding]:
    """The effective --disaggregation-mode must be the instance's role (null for a collocated server): an
    extra arg changing it makes a prefill node serve as a decode (or a plain server), which neither the
    router's pool nor the other role expects."""
    want = inst.role if inst.role in ("prefill", "decode") else "null"
    got = args.get(ROLE_FLAG) or "null"
    if got == want:
        return []
    return [
        Finding.fail(
            "launch.role",
            inst.node,
            inst.name,
            f"extra args set {ROLE_FLAG} {got} on a {inst.role} server (the profile makes it {want})",
            details={"flag": ROLE_FLAG, "profile": want, "extra": got},
            remedy=f"drop {ROLE_FLAG} from the extra args; change the node's roles in the profile instead",
        )
    ]


def _bootstrap_findings(inst: Instance, args: dict[str, str | None]) -> list[Finding]:
    """A bootstrap port set in extra args reaches this server only: the router (which tells decodes
    where each prefill's bootstrap server is) and the decodes' default keep the profile's port, so every
    transfer would fail to connect. Refused in favour of the profile settings every side reads."""
    if inst.bootstrap_port is None or args.get(BOOTSTRAP_FLAG) == str(inst.bootstrap_port):
        return []
    where = (
        "nodes[].overrides.bootstrap_port (this prefill) or sglang.prefill.bootstrap_port"
        if inst.role == "prefill"
        else "sglang.prefill.bootstrap_port (a decode assumes it for prefills that report none)"
    )
    return [
        Finding.fail(
            "launch.bootstrap_port",
            inst.node,
            inst.name,
            f"extra args set {BOOTSTRAP_FLAG} {args.get(BOOTSTRAP_FLAG)}, but the profile gives "
            f"{inst.bootstrap_port}, which the router and the decodes use; transfers would not connect",
            details={"flag": BOOTSTRAP_FLAG, "profile": inst.bootstrap_port, "extra": args.get(BOOTSTRAP_FLAG)},
            remedy=f"drop {BOOTSTRAP_FLAG} from the extra args and set {where}",
        )
    ]


def launch_problems(profile: Profile, selected: list[Instance] | None = None) -> list[Finding]:
    """Every problem of the launch plan as findings (warn/fail); empty when it is sound."""
    every = instances(profile)
    chosen = every if selected is None else selected
    rendered = {i.name: build_argv(profile, i) for i in every}
    args = {name: effective_args(r.argv) for name, r in rendered.items()}
    decode_hosts = {i.host for i in every if i.role == "decode"}
    out: list[Finding] = []
    table = flag_table()
    for inst in chosen:
        for ov in rendered[inst.name].overrides:
            spec = table.lookup(ov.flag)
            canonical = spec.canonical if spec else ov.flag
            if canonical in (ROLE_FLAG, BOOTSTRAP_FLAG):
                continue  # judged below as FAILs
            # a FAIL for flags launch allocates from (--tp-size, --port, ...), else a WARN
            out.append(override_finding(profile, inst, ov, canonical))
        out.extend(_flag_findings(inst, rendered[inst.name].argv))
        out.extend(_spec_findings(inst, args[inst.name]))
        out.extend(_host_findings(inst, args[inst.name], decode_hosts))
        out.extend(_role_findings(inst, args[inst.name]))
        out.extend(_bootstrap_findings(inst, args[inst.name]))
    out.extend(contradiction_findings(profile, chosen, args))  # no model, no GPUs, collocated + PD
    out.extend(antipattern_findings(profile, chosen, args))  # WARNs: big draft, unchunked, deep gamma, NIC
    out.extend(_pd_agreement(profile, every, chosen, args, pool_step_args(profile, chosen)))
    out.extend(_ib_map_findings(profile, chosen))
    out.extend(_kv_events_findings(every, chosen, args))
    out.extend(hicache_findings(profile, every, chosen, args))  # sglang.hicache (hicache_rules.py)
    return out


def _ib_map_findings(profile: Profile, chosen: list[Instance]) -> list[Finding]:
    """Every GPU of a PD instance needs an entry in the node's per-GPU HCA map (keys are physical GPU
    indexes); SGLang raises for a GPU without one, but only once the model is loading."""
    out: list[Finding] = []
    if profile.sglang.transfer_backend == "mooncake_tcp":
        return out
    for inst in chosen:
        rdma = profile.node(inst.node).rdma
        if inst.role not in ("prefill", "decode") or rdma is None or not rdma.device_map or not inst.gpus:
            continue
        missing = [g for g in inst.gpus if str(g) not in rdma.device_map]
        if missing:
            visible = visible_device_map(rdma.device_map, inst.gpus)
            out.append(
                Finding.fail(
                    "launch.ib_device",
                    inst.node,
                    inst.name,
                    f"nodes[].rdma.device_map has no HCA for GPU(s) {', '.join(map(str, missing))} of this "
                    f"server (it runs on GPUs {', '.join(map(str, inst.gpus))}); SGLang fails at start-up with "
                    "'No IB devices configured for GPU n'",
                    details={"missing_gpus": missing, "rendered_map": visible},
                    remedy="key device_map by physical GPU index (0..gpus-1) and give every GPU an entry",
                )
            )
    return out


_ENDPOINT_PORT = re.compile(r"^tcp://(?P<host>.+):(?P<port>\d+)$")


def _kv_ports(inst: Instance, value: str | None) -> dict[str, range]:
    """Ports a KV-events publisher binds: one per DP rank from each endpoint's port (SGLang 0.5.23)."""
    if value is None:
        return {}
    try:
        cfg = json.loads(value)
    except ValueError:
        return {}
    if not isinstance(cfg, dict) or cfg.get("publisher", "null") == "null":
        return {}
    ports: dict[str, range] = {}
    for key, default in (("endpoint", "tcp://*:5557"), ("replay_endpoint", None)):
        m = _ENDPOINT_PORT.match(str(cfg.get(key) or default or ""))
        if m:
            ports[key] = range(int(m["port"]), int(m["port"]) + inst.dp)
    return ports


def _kv_events_findings(
    every: list[Instance], chosen: list[Instance], args: dict[str, dict[str, str | None]]
) -> list[Finding]:
    """Two servers on one node (a node with both roles) publishing KV events on the same ports: the
    second fails to bind. The config is the user's JSON, so it is reported rather than rewritten."""
    out: list[Finding] = []
    taken: dict[tuple[str, int], str] = {}
    chosen_names = {i.name for i in chosen}
    for inst in every:
        for key, ports in _kv_ports(inst, args[inst.name].get("--kv-events-config")).items():
            clash = next((taken[(inst.node, p)] for p in ports if (inst.node, p) in taken), None)
            if clash and inst.name in chosen_names:
                out.append(
                    Finding.fail(
                        "launch.kv_events",
                        inst.node,
                        inst.name,
                        f"kv-events {key} ports {ports.start}-{ports.stop - 1} collide with {clash} on the "
                        "same node; the second publisher cannot bind",
                        remedy="give this role its own endpoint port (e.g. in nodes[].overrides.extra_args: "
                        "--kv-events-config with another port)",
                    )
                )
            for p in ports:
                taken.setdefault((inst.node, p), inst.name)
    return out


#: flags whose value SGLang parses as an integer: "64" and "064" are one page size
_INT_FLAGS = frozenset({"--page-size", *_SPEC_NUMBERS})


def _with_default(flag: str, args: dict[str, str | None]) -> str | None:
    """The value as SGLang holds it: unset means the flag's default (--kv-cache-dtype: auto). A default
    of None (--page-size: resolved from the attention backend) stays None: unset on one side and set on
    the other is reported, since the backend may resolve another size. Integer flags compare as the
    integers SGLang parses ("064" is page 64); the KV dtype compares as the string it is given: SGLang
    0.5.23 sends the prefill's `kv_cache_dtype_str`, which for an explicit dtype is the argument itself
    (mem_cache/kv_cache_dtype.py resolves only "auto"), so `bf16` vs `bfloat16` is a mismatch there."""
    if flag in args:
        value = args[flag]
    else:
        spec = flag_table().lookup(flag)
        default = spec.default if spec else None
        value = None if default in (None, "", "None") else default
    if value is None:
        return None
    if flag in _INT_FLAGS:
        try:
            return str(int(value))
        except ValueError:
            return value
    return value


def pool_step_args(profile: Profile, insts: list[Instance]) -> dict[str, dict[str, str]]:
    """Per decode of a pool with its own step count (speculative.pools): the step flags it renders."""
    out: dict[str, dict[str, str]] = {}
    for inst in insts:
        pool = server_override(profile, inst.node, inst.role, inst.config_dir)
        if pool is not None and inst.role == "decode":
            out[inst.name] = {"--speculative-num-steps": str(pool.num_steps),
                              "--speculative-num-draft-tokens": str(pool.num_draft_tokens)}
    return out


def _pd_agreement(
    profile: Profile, every: list[Instance], chosen: list[Instance], args: dict[str, dict[str, str | None]],
    pool_steps: dict[str, dict[str, str]],
) -> list[Finding]:
    prefills = [i for i in every if i.role == "prefill" and i.is_leader]
    if not prefills:
        return []
    ref = prefills[0]
    out: list[Finding] = []
    for inst in chosen:
        if inst.role not in ("prefill", "decode") or inst is ref:
            continue
        diffs = {
            f: (_with_default(f, args[ref.name]), _with_default(f, args[inst.name]))
            for f in PD_AGREEMENT
            if _with_default(f, args[ref.name]) != _with_default(f, args[inst.name])
            # a decode pool's own step count, as its pool renders it (speculative.pools, core/spec/pools.py)
            and not (f in pool_steps.get(inst.name, {}) and args[inst.name].get(f) == pool_steps[inst.name][f]
                     and decode_steps_may_differ(args[inst.name]))
        }
        for flag, (want, got) in diffs.items():
            # the extra args that set the flag on this server, else on the reference (the other side
            # leaves it at SGLang's default)
            field = (extra_args_source(profile, inst, flag) or extra_args_source(profile, ref, flag)
                     or f"sglang.extra_args.{inst.role}")
            out.append(
                Finding.fail(
                    "launch.pd_agreement",
                    inst.node,
                    inst.name,
                    f"{flag} is {got} here but {want} on {ref.name}; prefill and decode must agree",
                    details={"flag": flag, "reference": ref.name, "expected": want, "actual": got, "field": field},
                    remedy=f"make the extra args of both roles agree on this setting ({flag} is set in {field})",
                )
            )
    return out

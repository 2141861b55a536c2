"""`sglang.hicache`: the profile section (refused combinations name their field), its rendering per role,
the `launch.hicache` rules on the effective command lines, and (marked sglang) SGLang 0.5.23's own
parser and HiCache resolution hooks on every rendered HiCache line of the shipped profiles and three
variants: accepted, and nothing rewritten."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from infer_ctl.cli.main import main
from infer_ctl.core.sglang import build_argv, instances, server_args
from infer_ctl.core.sglang.consistency import effective_args, launch_problems
from infer_ctl.errors import ProfileError
from infer_ctl.launch.argcheck import check_instances, parse_with_sglang, sglang_available
from infer_ctl.profile import Profile
from infer_ctl.profile.load import validate_profile_data
from infer_ctl.resources import builtin_profile_names

needs_sglang = pytest.mark.skipif(not sglang_available(), reason="sglang not importable: pip install 'inferctl[sglang]'")


def _data(hicache: dict[str, Any] | None = None, **sglang: Any) -> dict[str, Any]:
    return {
        "name": "hc",
        "nodes": [{"name": "pf-01", "host": "10.0.0.11", "roles": ["prefill"]},
                  {"name": "dc-01", "host": "10.0.0.21", "roles": ["decode"]}],
        "models": {"target": {"path": "/m", "tp": 8}},
        "sglang": {**({"hicache": hicache} if hicache is not None else {}), **sglang},
    }  # fmt: skip


def _profile(hicache: dict[str, Any] | None = None, **sglang: Any) -> Profile:
    return validate_profile_data(_data(hicache, **sglang))


def _args(p: Profile, name: str) -> dict[str, str | None]:
    inst = next(i for i in instances(p) if i.name == name)
    return effective_args(build_argv(p, inst).argv)


def _hicache_args(p: Profile, name: str) -> dict[str, str | None]:
    keep = ("--enable-hierarchical-cache", "--hicache", "--radix-eviction", "--enable-session",
            "--disaggregation-decode-enable")
    return {k: v for k, v in _args(p, name).items() if k.startswith(keep)}


# ---- the profile section ------------------------------------------------------------------------------


@pytest.mark.parametrize(("hicache", "field", "fragment"), [
    ({"io_backend": "direct"}, "sglang.hicache.io_backend", "SGLang switches the layout to page_first_direct"),
    ({"mem_layout": "page_first_direct"}, "sglang.hicache.mem_layout", "SGLang switches the io backend to direct"),
    ({"mem_layout": "page_head", "io_backend": "direct"}, "sglang.hicache.mem_layout", "no direct io path"),
    ({"host_memory_mode": "buffer_only"}, "sglang.hicache.host_memory_mode", "refuses it without a storage backend"),
    ({"host_memory_mode": "buffer_only", "storage": {"backend": "file"}, "write_policy": "write_back"},
     "sglang.hicache.write_policy", "rewrites write_back to write_through"),
    ({"ratio": 2, "host_memory_fraction": 0.5}, "sglang.hicache.host_memory_fraction", "ignores host_memory_fraction"),
    ({"ratio": 2, "size_gb": 100}, "sglang.hicache.ratio", "size_gb overrides ratio"),
    ({"storage": {"backend": "mooncake"}, "mem_layout": "layer_first"}, "sglang.hicache.mem_layout",
     "mooncake storage backend does not support layer_first"),
    ({"roles": ["prefill", "decode"]}, "sglang.hicache.roles", "needs decode.mode"),
    ({"roles": ["prefill", "decode"], "decode": {"mode": "offload"}}, "sglang.hicache.decode.mode",
     "refuses it without one"),
    ({"roles": ["prefill", "decode"], "decode": {"mode": "radix", "host_memory_mode": "buffer_only"},
      "storage": {"backend": "file"}}, "sglang.hicache.decode.host_memory_mode", "refuses buffer_only on decode"),
    ({"roles": ["prefill", "decode"], "decode": {"mode": "offload"},
      "storage": {"backend": "file", "extra_config": "@/etc/hicache.json"}},
     "sglang.hicache.decode.storage.extra_config", "inline JSON only"),
    ({"decode": {"mode": "radix"}}, "sglang.hicache.decode", "has no effect"),
    ({"roles": ["collocated"]}, "sglang.hicache.roles[0]", "set `collocated: true`"),
    ({"eviction_policy": "tlru"}, "sglang.hicache.eviction_policy_config", "tlru needs threshold > next_prompt_estimate"),
    ({"eviction_policy": "lru", "eviction_policy_config": {"protected_threshold": 2}},
     "sglang.hicache.eviction_policy_config.protected_threshold", "lru takes no parameters"),
    ({"eviction_policy_config": {"threshold": 2}}, "sglang.hicache.eviction_policy_config", "set eviction_policy"),
    ({"prefill": {"io_backend": "direct"}}, "sglang.hicache.prefill.io_backend", "switches the layout"),
    ({"io_backend": "kernel_ascend"}, "sglang.hicache.io_backend", "'kernel_ascend' is not one of kernel, direct"),
    ({"storage": {"backend": "file", "extra_config": "relative.json"}}, "sglang.hicache.storage.extra_config",
     "'@/absolute/path' of a JSON/YAML/TOML file on the nodes"),
    # YAML .inf passed gt=0 and rendered --hicache-ratio inf (SGLang: int(device tokens x inf) fails)
    ({"ratio": float("inf")}, "sglang.hicache.ratio", "finite number"),
    ({"prefill": {"ratio": float("inf")}}, "sglang.hicache.prefill.ratio", "finite number"),
])  # fmt: skip
def test_profile_refuses_what_sglang_would_refuse_or_rewrite(hicache: dict[str, Any], field: str, fragment: str) -> None:
    with pytest.raises(ProfileError) as exc:
        _profile(hicache)
    assert any(line.startswith(f"{field}:") and fragment in line for line in exc.value.errors), exc.value.errors


def test_pinned_prefixes_need_the_priority_policy() -> None:
    data = _data({"eviction_policy": "lru"})
    data["router"] = {"prefixes": [{"name": "p", "text": "x", "pin": True}]}
    with pytest.raises(ProfileError, match=r"sglang\.hicache\.eviction_policy: router\.prefixes pins prefixes"):
        validate_profile_data(data)
    data["sglang"]["hicache"]["eviction_policy"] = "priority"
    p = validate_profile_data(data)
    argv = build_argv(p, instances(p)[0]).argv
    assert argv.count("--radix-eviction-policy") == 1 and _args(p, "pf-01-prefill")["--radix-eviction-policy"] == "priority"


def test_decode_radix_refused_with_a_draft_sglang_does_not_run_there() -> None:
    data = _data({"roles": ["prefill", "decode"], "decode": {"mode": "radix"}})
    data["models"]["draft"] = {"algorithm": "NGRAM"}
    with pytest.raises(ProfileError, match=r"sglang\.hicache\.decode\.mode: SGLang refuses the decode radix cache "
                                           r"with speculative algorithm NGRAM"):
        validate_profile_data(data)


# ---- rendering ---------------------------------------------------------------------------------------------


def test_only_what_is_set_is_rendered_and_only_on_its_roles() -> None:
    p = _profile({})
    assert _hicache_args(p, "pf-01-prefill") == {"--enable-hierarchical-cache": None}
    assert _hicache_args(p, "dc-01-decode") == {}  # roles default to prefill and collocated
    assert _hicache_args(_profile(None), "pf-01-prefill") == {}
    assert _hicache_args(_profile({"enable": False, "ratio": 3}), "pf-01-prefill") == {}


def test_each_role_gets_its_own_flags() -> None:
    p = _profile({
        "roles": ["prefill", "decode"], "ratio": 3.0, "write_policy": "write_through_selective",
        "io_backend": "direct", "mem_layout": "page_first_direct",
        "storage": {"backend": "file", "extra_config": {"b": 2, "a": "x"}, "prefetch_policy": "wait_complete"},
        "eviction_policy": "slru", "eviction_policy_config": {"protected_threshold": 3}, "session_cache": True,
        "decode": {"mode": "offload", "size_gb": 40},
    })  # fmt: skip
    assert _hicache_args(p, "pf-01-prefill") == {
        "--enable-hierarchical-cache": None, "--hicache-ratio": "3.0",
        "--hicache-write-policy": "write_through_selective", "--hicache-io-backend": "direct",
        "--hicache-mem-layout": "page_first_direct", "--hicache-storage-backend": "file",
        "--hicache-storage-backend-extra-config": '{"a":"x","b":2}', "--hicache-storage-prefetch-policy": "wait_complete",
        "--radix-eviction-policy": "slru", "--radix-eviction-policy-config": '{"protected_threshold":3}',
        "--enable-session-radix-cache": None,
    }  # fmt: skip
    # offload: no radix tree on the decode, so no HiCache switch, eviction policy or session cache; its own
    # size replaces the section's ratio
    assert _hicache_args(p, "dc-01-decode") == {
        "--disaggregation-decode-enable-offload-kvcache": None, "--hicache-size": "40",
        "--hicache-write-policy": "write_through_selective", "--hicache-io-backend": "direct",
        "--hicache-mem-layout": "page_first_direct", "--hicache-storage-backend": "file",
        "--hicache-storage-backend-extra-config": '{"a":"x","b":2}', "--hicache-storage-prefetch-policy": "wait_complete",
    }  # fmt: skip
    radix = _profile({"roles": ["prefill", "decode"], "decode": {"mode": "radix", "host_memory_fraction": 0.3}})
    assert _hicache_args(radix, "dc-01-decode") == {
        "--enable-hierarchical-cache": None, "--disaggregation-decode-enable-radix-cache": None,
        "--hicache-host-memory-fraction": "0.3"}  # fmt: skip


# ---- launch.hicache on the effective command lines ---------------------------------------------------------


def _hicache_problems(p: Profile) -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    for f in launch_problems(p):
        if f.check == "launch.hicache":
            out.setdefault(f.subject, []).append((f.status.value, f.message))
    return out


def test_a_sound_section_has_no_findings() -> None:
    extra = {"prefill": ["--page-size", "64"], "decode": ["--page-size", "64"]}
    p = _profile({"storage": {"backend": "file"}, "mem_layout": "page_first_direct", "io_backend": "direct"},
                 extra_args=extra)
    assert _hicache_problems(p) == {}


@pytest.mark.parametrize(("hicache", "extra", "instance", "expected"), [
    ({}, {"prefill": ["--disable-radix-cache"]}, "pf-01-prefill",
     ("fail", "--disable-radix-cache in the extra args (sglang.extra_args.prefill / nodes[].overrides.extra_args): "
              "HiCache with --disable-radix-cache: SGLang refuses the pair")),
    (None, {"decode": ["--enable-hicache"]}, "dc-01-decode",
     ("fail", "--enable-hierarchical-cache in the extra args (sglang.extra_args.decode / nodes[].overrides.extra_args): "
              "SGLang runs PD decodes without a radix cache")),
    ({}, {"prefill": ["--hicache-io-backend", "direct"]}, "pf-01-prefill",
     ("warn", "--hicache-io-backend in the extra args (sglang.extra_args.prefill / nodes[].overrides.extra_args): "
              "page_first with the direct io backend: SGLang switches the layout to page_first_direct")),
    ({}, {"prefill": ["--hicache-mem-layout", "page_first_kv_split"]}, "pf-01-prefill",
     ("fail", "--hicache-mem-layout in the extra args (sglang.extra_args.prefill / nodes[].overrides.extra_args): "
              "page_first_kv_split is SGLang's Ascend NPU choice")),
    ({"ratio": 0.5}, {}, "pf-01-prefill",
     ("warn", "sglang.hicache.ratio: ratio 0.5: the host pool is not larger than the device pool")),
    ({"storage": {"backend": "hf3fs"}}, {"prefill": ["--page-size", "16"], "decode": ["--page-size", "16"]},
     "pf-01-prefill", ("warn", "--page-size in the extra args (sglang.extra_args.prefill / nodes[].overrides.extra_args): "
                               "page size 16 with storage backend hf3fs: each page is one storage object per rank")),
    ({"storage": {"backend": "file"}}, {}, "pf-01-prefill",
     ("warn", "--page-size (unset; set it in sglang.extra_args.prefill): page size 1 (SGLang default) with storage "
              "backend file")),
    ({"roles": ["prefill", "decode"], "decode": {"mode": "radix"}}, {}, "dc-01-decode",
     ("warn", "sglang.hicache.decode.mode: the decode radix cache is EXPERIMENTAL in SGLang 0.5.23")),
    ({"roles": ["prefill", "decode"], "decode": {"mode": "offload"}, "storage": {"backend": "file"}},
     {"decode": ["--disaggregation-decode-retraction-backup", "host_pool", "--page-size", "64"],
      "prefill": ["--page-size", "64"]}, "dc-01-decode",
     ("fail", "--disaggregation-decode-retraction-backup in the extra args (sglang.extra_args.decode / "
              "nodes[].overrides.extra_args): host_pool retraction and decode KV offload both build a decode host pool")),
    (None, {"prefill": ["--disaggregation-decode-enable-offload-kvcache", "--hicache-storage-backend", "file",
                        "--page-size", "64"], "decode": ["--page-size", "64"]}, "pf-01-prefill",
     ("fail", "--disaggregation-decode-enable-offload-kvcache in the extra args (sglang.extra_args.prefill / "
              "nodes[].overrides.extra_args): decode KV offload on a server that is not a PD decode")),
    ({"storage": {"backend": "file"}}, {"prefill": ["--enable-kv-cache-sharding", "--page-size", "64"],
                                        "decode": ["--page-size", "64"]}, "pf-01-prefill",
     ("fail", "sglang.hicache.storage.backend: --enable-kv-cache-sharding supports HiCache host offload but not a "
              "storage backend")),
    ({}, {"prefill": ["--radix-eviction-policy", "tlru"]}, "pf-01-prefill",
     ("fail", "--radix-eviction-policy in the extra args (sglang.extra_args.prefill / nodes[].overrides.extra_args): "
              "tlru needs threshold > next_prompt_estimate >= 0")),
    # decode context parallelism with HiCache: resolve_hicache_dcp_compatibility (hicache_hook.py)
    ({}, {"prefill": ["--dcp-size", "2", "--speculative-algorithm", "EAGLE3"]}, "pf-01-prefill",
     ("fail", "--speculative-algorithm in the extra args (sglang.extra_args.prefill / nodes[].overrides.extra_args): "
              "HiCache with --dcp-size 2 supports DSPARK drafts only")),
    ({}, {"prefill": ["--dcp-size", "2", "--enable-hisparse"]}, "pf-01-prefill",
     ("fail", "--enable-hisparse in the extra args (sglang.extra_args.prefill / nodes[].overrides.extra_args): "
              "--enable-hisparse with --dcp-size 2 and HiCache")),
    ({"host_memory_mode": "buffer_only", "storage": {"backend": "file"}}, {"prefill": ["--dcp-size", "4"]},
     "pf-01-prefill", ("fail", "sglang.hicache.host_memory_mode: HiCache storage with --dcp-size 4 does not support "
                               "buffer_only")),
    # a ratio SGLang's float parser takes but cannot size a pool with (int(device tokens x ratio))
    *[({}, {"prefill": ["--hicache-ratio", bad]}, "pf-01-prefill",
       ("fail", "--hicache-ratio in the extra args (sglang.extra_args.prefill / nodes[].overrides.extra_args): "
                f"--hicache-ratio {bad} is not a positive finite number")) for bad in ("nan", "inf", "-1", "0")],
    ({"write_policy": "write_through"}, {"prefill": ["--disaggregation-decode-allocation-policy", "prefill_complete"]},
     "pf-01-prefill", ("fail", "sglang.hicache.roles: --disaggregation-decode-allocation-policy prefill_complete does "
                               "not support prefill HiCache other than L2 write_back")),
    # decode-side HiCache: what SGLang's PD and HiCache hooks refuse or rewrite on a decode
    ({"roles": ["prefill", "decode"], "decode": {"mode": "offload"}, "storage": {"backend": "file"}},
     {"decode": ["--disaggregation-decode-host-receive-threshold", "0.5", "--page-size", "64"],
      "prefill": ["--page-size", "64"]}, "dc-01-decode",
     ("fail", "--disaggregation-decode-host-receive-threshold in the extra args (sglang.extra_args.decode / "
              "nodes[].overrides.extra_args): decode host receive (a threshold below 1) makes SGLang use host_pool")),
    ({"roles": ["prefill", "decode"], "decode": {"mode": "radix"}}, {"decode": ["--enable-hisparse"]}, "dc-01-decode",
     ("fail", "--enable-hisparse in the extra args (sglang.extra_args.decode / nodes[].overrides.extra_args): SGLang "
              "refuses the decode radix cache with --enable-hisparse")),
    ({"roles": ["prefill", "decode"], "decode": {"mode": "radix"}},
     {"decode": ["--disaggregation-transfer-backend", "fake"]}, "dc-01-decode",
     ("fail", "--disaggregation-transfer-backend in the extra args (sglang.extra_args.decode / "
              "nodes[].overrides.extra_args): SGLang refuses the decode radix cache with the fake transfer backend")),
    ({"roles": ["prefill", "decode"], "decode": {"mode": "radix"}},
     {"decode": ["--disaggregation-decode-host-receive-threshold", "0.5"]}, "dc-01-decode",
     ("warn", "--disaggregation-decode-host-receive-threshold in the extra args (sglang.extra_args.decode / "
              "nodes[].overrides.extra_args): decode host receive (--disaggregation-decode-host-receive-threshold < 1) "
              "shares its layer_first host pool with HiCache: SGLang switches the layout to layer_first")),
    ({"roles": ["prefill", "decode"], "decode": {"mode": "radix", "storage": {"backend": "mooncake"}}},
     {"decode": ["--disaggregation-decode-host-receive-threshold", "0.5", "--page-size", "64"],
      "prefill": ["--page-size", "64"]}, "dc-01-decode",
     ("fail", "sglang.hicache.decode.storage.backend: decode host receive (--disaggregation-decode-host-receive-threshold "
              "< 1) needs the layer_first host layout")),
])  # fmt: skip
def test_effective_command_line_rules(hicache: dict[str, Any] | None, extra: dict[str, list[str]], instance: str,
                                      expected: tuple[str, str]) -> None:
    found = _hicache_problems(_profile(hicache, extra_args=extra)).get(instance, [])
    assert any(s == expected[0] and m.startswith(expected[1]) for s, m in found), found


def test_two_auto_sized_servers_on_one_node_over_commit_host_memory() -> None:
    data = _data({"roles": ["prefill", "decode"], "decode": {"mode": "radix"}})
    data["nodes"] = [{"name": "box", "host": "10.0.0.5", "roles": ["prefill", "decode"], "gpus": 8}]
    data["sglang"]["prefill"] = {"tp": 4}
    data["sglang"]["decode"] = {"tp": 4}
    found = _hicache_problems(validate_profile_data(data))
    over = [m for ms in found.values() for s, m in ms if "over-commit" in m]
    assert len(over) == 2 and "(together 1.6)" in over[0], found
    data["sglang"]["hicache"]["prefill"] = {"host_memory_fraction": 0.5}
    data["sglang"]["hicache"]["decode"]["host_memory_fraction"] = 0.4
    assert not [m for ms in _hicache_problems(validate_profile_data(data)).values() for _, m in ms if "over-commit" in m]


def test_a_hicache_fail_makes_profile_validate_exit_64_and_a_warning_1(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(json.dumps(_data({}, extra_args={"prefill": ["--disable-radix-cache"]})))
    assert main(["profile", "validate", "-p", str(path), "--json"]) == 64
    doc = json.loads(capsys.readouterr().out)
    assert ("launch.hicache", "fail") in [(f["check"], f["status"]) for f in doc["findings"]]
    path.write_text(json.dumps(_data({"ratio": 0.8})))
    assert main(["profile", "validate", "-p", str(path), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [f["message"] for f in doc["findings"] if f["status"] == "warn"] == [
        "sglang.hicache.ratio: ratio 0.8: the host pool is not larger than the device pool, so it holds little the "
        "GPU does not (SGLang warns 'L2 cache effectiveness is reduced', HostKVCache, mem_cache/pool_host/base.py)"]


# ---- SGLang's own parser and HiCache hooks ----------------------------------------------------------------


def _variants() -> list[tuple[str, Profile]]:
    """The shipped profiles that run HiCache, and three variants over the shipped profiles."""
    out = [(n, p) for n in builtin_profile_names()
           if (p := validate_profile_data(_builtin(n))).sglang.hicache is not None]  # fmt: skip
    ref = _builtin("reference-h100-h200")
    storage = copy.deepcopy(ref)  # an L3 tier on the prefills, and decodes that offload to it
    storage["sglang"]["hicache"] = {
        "roles": ["prefill", "decode"], "size_gb": 200, "io_backend": "direct", "mem_layout": "page_first_direct",
        "write_policy": "write_through",
        "storage": {"backend": "file", "extra_config": {"file_path": "/var/cache/hicache"},
                    "prefetch_policy": "wait_complete"},
        "decode": {"mode": "offload", "size_gb": 50},
    }  # fmt: skip
    radix = copy.deepcopy(ref)  # decode-side HiCache (EAGLE3 is allowed there), pinned prefixes: priority
    radix["sglang"]["hicache"] = {"roles": ["prefill", "decode"], "ratio": 2.5, "eviction_policy": "priority",
                                  "session_cache": True, "decode": {"mode": "radix", "ratio": 1.5}}
    single = _builtin("single-node-collocated")  # one collocated server: layer_first, write_back, auto-sizing
    single["sglang"]["hicache"] = {"mem_layout": "layer_first", "write_policy": "write_back",
                                   "host_memory_fraction": 0.5, "eviction_policy": "tlru",
                                   "eviction_policy_config": {"threshold": 4096, "next_prompt_estimate": 512}}
    out += [("reference+storage", validate_profile_data(storage)), ("reference+decode-radix", validate_profile_data(radix)),
            ("single+hicache", validate_profile_data(single))]  # fmt: skip
    return out


def _builtin(name: str) -> dict[str, Any]:
    root = Path(__file__).resolve().parents[2] / "profiles"
    data: dict[str, Any] = yaml.safe_load((root / f"{name}.yaml").read_text())
    return data


def test_the_variants_are_hicache_lines_with_no_findings() -> None:
    names = [n for n, _ in _variants()]
    assert names == ["reference-h100-h200", "reference+storage", "reference+decode-radix", "single+hicache"]
    for name, p in _variants():
        hicache = [i for i in instances(p) if "--enable-hierarchical-cache" in _args(p, i.name)
                   or "--disaggregation-decode-enable-offload-kvcache" in _args(p, i.name)]  # fmt: skip
        assert hicache, name
        found = [(f.status.value, f.message) for f in launch_problems(p) if f.check == "launch.hicache"]
        # the one documented warning: SGLang's decode radix cache is experimental
        assert [m for s, m in found if "EXPERIMENTAL" not in m] == [], name


#: what `handle_hicache_ratio_default`, `handle_pd_disaggregation` and `handle_hicache` may resolve
HICACHE_FIELDS = ("enable_hierarchical_cache", "hicache_host_memory_mode", "hicache_ratio", "hicache_size",
                  "hicache_host_memory_fraction", "hicache_write_policy", "hicache_io_backend", "hicache_mem_layout",
                  "hicache_storage_backend", "hicache_storage_prefetch_policy", "disable_radix_cache")


def _sglang_resolves(args: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(parsed, resolved) HiCache fields: SGLang's parser, then its model-free HiCache hooks in pipeline
    order (arg_groups/pipeline.py; handle_cache_compatibility needs the model's config and is left out).
    Raises what a hook raises."""
    from sglang.srt.arg_groups.arg_utils import record_fields
    from sglang.srt.arg_groups.hicache_hook import handle_hicache, handle_hicache_ratio_default
    from sglang.srt.arg_groups.overrides import resolved_view
    from sglang.srt.arg_groups.pd_disaggregation_hook import handle_pd_disaggregation
    from sglang.srt.arg_groups.resolution_hooks import run_hook

    sa = parse_with_sglang(args)
    parsed = {f: getattr(sa, f) for f in HICACHE_FIELDS}
    sa._raw_input = {f.name: getattr(sa, f.name) for f in record_fields(type(sa))}
    sa._resolved_overrides = list(getattr(sa, "_resolved_overrides", ()))
    sa._input_frozen = True
    env = dict(os.environ)
    try:
        for hook in (handle_hicache_ratio_default, handle_pd_disaggregation, handle_hicache):
            run_hook(hook, sa)
        view = resolved_view(sa)
        return parsed, {f: getattr(view, f) for f in HICACHE_FIELDS}
    finally:
        sa._input_frozen = False
        os.environ.clear()
        os.environ.update(env)


@pytest.mark.sglang
@needs_sglang
@pytest.mark.parametrize("variant", range(4))
def test_sglang_parses_every_hicache_line_and_rewrites_nothing(variant: int) -> None:
    name, p = _variants()[variant]
    rendered = [(i, build_argv(p, i).argv) for i in instances(p)]
    results = check_instances(rendered)  # SGLang's parser + the model-free hooks launch --check-args runs
    assert all(r.ok for r in results), [r for r in results if not r.ok]
    for inst, argv in rendered:
        args = server_args(argv)
        parsed, resolved = _sglang_resolves(args)
        given = {f for f in HICACHE_FIELDS if "--" + f.replace("_", "-") in effective_args(argv)}
        assert {f: resolved[f] for f in given} == {f: parsed[f] for f in given}, (name, inst.name)
        if inst.role == "decode" and parsed["enable_hierarchical_cache"]:
            assert resolved["disable_radix_cache"] is False  # the decode radix cache HiCache needs


@pytest.mark.sglang
@needs_sglang
@pytest.mark.parametrize(("flags", "field", "sglang_makes_it"), [
    # the combinations the profile refuses: SGLang's hooks rewrite them (so what ran would differ)
    (["--hicache-io-backend", "direct"], "hicache_mem_layout", "page_first_direct"),
    (["--hicache-mem-layout", "page_first_direct"], "hicache_io_backend", "direct"),
    (["--hicache-storage-backend", "mooncake", "--hicache-mem-layout", "layer_first"], "hicache_mem_layout", "page_first"),
    (["--hicache-host-memory-mode", "buffer_only", "--hicache-storage-backend", "file", "--hicache-write-policy",
      "write_back"], "hicache_write_policy", "write_through"),
    (["--hicache-ratio", "3", "--hicache-host-memory-fraction", "0.5"], "hicache_host_memory_fraction", None),
    # a PD decode without the decode radix cache: SGLang disables its radix cache (then refuses HiCache)
    (["--disaggregation-mode", "decode"], "disable_radix_cache", True),
])  # fmt: skip
def test_sglang_rewrites_what_the_profile_refuses(flags: list[str], field: str, sglang_makes_it: Any) -> None:
    parsed, resolved = _sglang_resolves(["--model-path", "/m", "--enable-hierarchical-cache", *flags])
    assert parsed[field] != sglang_makes_it and resolved[field] == sglang_makes_it


@pytest.mark.sglang
@needs_sglang
@pytest.mark.parametrize(("flags", "fragment"), [
    (["--hicache-host-memory-mode", "buffer_only"], "requires a storage backend"),
    (["--hicache-host-memory-mode", "buffer_only", "--hicache-storage-backend", "file", "--disaggregation-mode",
      "decode", "--disaggregation-decode-enable-radix-cache"], "not supported on decode instances"),
    (["--hicache-host-memory-fraction", "1.5"], "must be in (0, 1]"),
])  # fmt: skip
def test_sglang_refuses_what_the_profile_refuses(flags: list[str], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        _sglang_resolves(["--model-path", "/m", "--enable-hierarchical-cache", *flags])


# ---- launch --check-args: SGLang's HiCache hooks, and the rules of handle_cache_compatibility ----------------


def _checked(p: Profile) -> dict[str, Any]:
    return {r.instance: r for r in check_instances([(i, build_argv(p, i).argv) for i in instances(p)])}


@pytest.mark.sglang
@needs_sglang
@pytest.mark.parametrize(("extra", "hook", "fragment"), [
    # a PD decode runs without a radix cache (handle_pd_disaggregation), then HiCache there is refused
    (["--enable-hierarchical-cache"], "handle_cache_compatibility (HiCache rules)",
     "enable-hierarchical-cache and disable-radix-cache are mutually exclusive"),
    (["--enable-hierarchical-cache", "--disaggregation-decode-enable-radix-cache", "--hicache-host-memory-mode",
      "buffer_only", "--hicache-storage-backend", "file"], "handle_hicache", "not supported on decode instances"),
    (["--disaggregation-decode-enable-offload-kvcache"], "handle_cache_compatibility (HiCache rules)",
     "only supported when hicache-storage-backend is provided"),
    (["--disaggregation-decode-enable-offload-kvcache", "--hicache-storage-backend", "file",
      "--disaggregation-decode-retraction-backup", "host_pool"], "handle_cache_compatibility (HiCache rules)",
     "mutually exclusive: both build a decode host pool"),
    (["--enable-hierarchical-cache", "--disaggregation-decode-enable-radix-cache", "--hicache-host-memory-fraction",
      "2"], "handle_hicache_ratio_default", "must be in (0, 1]"),
    # host receive resolves the retraction backup to host_pool (handle_pd_disaggregation), which offload refuses
    (["--disaggregation-decode-enable-offload-kvcache", "--hicache-storage-backend", "file",
      "--disaggregation-decode-host-receive-threshold", "0.5"], "handle_cache_compatibility (HiCache rules)",
     "mutually exclusive: both build a decode host pool"),
    (["--enable-hierarchical-cache", "--disaggregation-decode-enable-radix-cache", "--hicache-storage-backend",
      "mooncake", "--disaggregation-decode-host-receive-threshold", "0.5"], "handle_hicache",
     "cannot share the layer_first decode host pool"),
    (["--enable-hierarchical-cache", "--disaggregation-decode-enable-radix-cache", "--enable-hisparse"],
     "handle_pd_disaggregation", "incompatible with --enable-hisparse"),
])  # fmt: skip
def test_check_args_runs_sglangs_hicache_hooks_on_the_decode(extra: list[str], hook: str, fragment: str) -> None:
    res = _checked(_profile(None, extra_args={"decode": extra}))
    assert res["pf-01-prefill"].ok
    bad = res["dc-01-decode"]
    assert not bad.ok and bad.error is not None and bad.error.startswith(f"{hook}: ") and fragment in bad.error, bad


@pytest.mark.sglang
@needs_sglang
def test_check_args_accepts_decode_hicache_with_the_decode_radix_cache_and_lists_the_hooks() -> None:
    res = _checked(_profile({"roles": ["prefill", "decode"], "decode": {"mode": "radix"}}))
    assert all(r.ok and not r.rewrites for r in res.values()), res
    assert res["dc-01-decode"].hooks == ["handle_hicache_ratio_default", "handle_pd_disaggregation", "handle_hicache",
                                         "handle_cache_compatibility (HiCache rules)"]


@pytest.mark.sglang
@needs_sglang
def test_check_args_warns_of_a_hicache_setting_sglang_rewrites(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    res = _checked(_profile({}, extra_args={"prefill": ["--hicache-io-backend", "direct"]}))
    assert res["pf-01-prefill"].ok and res["pf-01-prefill"].rewrites == {
        "--hicache-mem-layout": ("page_first", "page_first_direct")}  # _resolve_layout_io_compatibility
    path = tmp_path / "p.yaml"
    path.write_text(json.dumps(_data({}, extra_args={"prefill": ["--hicache-io-backend", "direct"]})))
    assert main(["launch", "--check-args", "-p", str(path), "--json"]) == 1
    found = [f for f in json.loads(capsys.readouterr().out)["findings"] if f["check"] == "launch.sglang_parser"]
    pf = next(f for f in found if f["subject"] == "pf-01-prefill")
    assert pf["status"] == "warn" and pf["message"].endswith("but its hooks rewrite --hicache-mem-layout page_first -> "
                                                             "page_first_direct")


def test_the_reproduced_cache_compatibility_rules_follow_sglangs_order() -> None:
    from infer_ctl.core.sglang.hicache_rules import cache_compatibility_error

    ok = {"disaggregation_mode": "null", "enable_hierarchical_cache": True, "disable_radix_cache": False}
    assert cache_compatibility_error(ok) is None
    assert "mutually exclusive" in (cache_compatibility_error({**ok, "disable_radix_cache": True}) or "")
    tlru = {**ok, "radix_eviction_policy": "tlru", "radix_eviction_policy_config": {"threshold": 5,
                                                                                   "next_prompt_estimate": 5}}
    assert "got 5 <= 5" in (cache_compatibility_error(tlru) or "")
    assert cache_compatibility_error({**ok, "enable_lmcache": True}) == ("--enable-lmcache and "
                                                                        "--enable-hierarchical-cache are mutually exclusive")


def test_hicache_with_decode_context_parallelism_needs_an_mla_model() -> None:
    # resolve_hicache_dcp_compatibility: "HiCache with --dcp-size > 1 is only supported for MLA models"
    def dcp_fails(preset: str) -> list[str]:
        data = _data({}, extra_args={"prefill": ["--dcp-size", "2"]})
        data["models"]["target"]["preset"] = preset
        return [m for s, m in _hicache_problems(validate_profile_data(data)).get("pf-01-prefill", [])
                if s == "fail" and "--dcp-size" in m]

    (gqa,) = dcp_fails("llama-3.1-70b")
    assert gqa.startswith("--dcp-size in the extra args") and "works for MLA models only" in gqa
    assert dcp_fails("deepseek-v3") == []

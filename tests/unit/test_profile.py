"""Profile loading and validation: every shipped profile validates, every kind of bad input names its field."""

from __future__ import annotations

from pathlib import Path

import pytest

from infer_ctl.errors import ProfileError
from infer_ctl.profile import load_profile, parse_profile_text, resolve_profile_path
from infer_ctl.resources import builtin_profile_names, profiles_dir

SHIPPED = sorted(profiles_dir().glob("*.yaml"))

BASE = """\
name: t
nodes:
  - {name: pf-01, host: 10.0.0.1, roles: [prefill]}
  - {name: dc-01, host: 10.0.0.2, roles: [decode]}
"""


def test_there_are_shipped_profiles() -> None:
    assert {"local", "reference-h100-h200", "single-node-collocated"} <= set(builtin_profile_names())


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_profiles_validate(path: Path) -> None:
    profile = load_profile(path)
    assert profile.nodes
    assert profile.base_dir == path.resolve().parent


def test_reference_profile_shape() -> None:
    prof = load_profile("builtin:reference-h100-h200")
    assert len(prof.nodes_with_role("prefill")) == 2
    assert len(prof.nodes_with_role("decode")) == 6
    assert prof.models is not None and prof.models.draft is not None
    assert prof.models.draft.algorithm == "EAGLE3"
    # per-node override merges over the fleet-wide policy
    assert prof.gpu_policy_for(prof.node("dc-06")).max_temp_c == 80
    assert prof.gpu_policy_for(prof.node("dc-01")).max_temp_c == 85


def _error(text: str) -> list[str]:
    with pytest.raises(ProfileError) as info:
        parse_profile_text(text, "p.yaml")
    return info.value.errors


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (BASE.replace("[prefill]", "[prefil]"),
         "nodes[0].roles[0]: 'prefil' is not one of prefill, decode (did you mean 'prefill'?)"),
        (BASE + "sglang: {transfer_backnd: nixl}\n", "sglang.transfer_backnd: unknown key 'transfer_backnd' (did you mean 'transfer_backend'?)"),
        (BASE.replace("roles: [decode]}", "roles: [decode], gpu: 8}"), "nodes[1].gpu: unknown key 'gpu' (did you mean 'gpus'?)"),
        (BASE + "nodez: []\n", "nodez: unknown key 'nodez' (did you mean 'nodes'?)"),
        (BASE.replace("roles: [decode]}", "roles: [decode], gpus: eight}"), "nodes[1].gpus: Input should be a valid integer"),
        (BASE + "sglang: {prefill: {port: 70000}}\n", "sglang.prefill.port: Input should be less than or equal to 65535"),
        (BASE + "sglang: {decode: {port: 0}}\n", "sglang.decode.port: Input should be greater than or equal to 1"),
        (BASE.replace("name: dc-01", "name: pf-01"), "nodes[1].name: duplicate node name 'pf-01'"),
        (BASE.replace("10.0.0.2", "10.0.0.1"), "nodes[1].host: 10.0.0.1:22 is also node 'pf-01'"),
        (BASE.replace("[decode]", "[prefill]"), "nodes: no node has role 'decode'"),
        (BASE + "models: {target: {path: /m}, draft: {path: /d, algorithm: EAGLE3, num_steps: 3}}\n",
         "models.draft: set all three of num_steps, eagle_topk, num_draft_tokens or none of them"),
        (BASE + "models: {target: {path: /m}, draft: {path: /d, algorithm: EAGLE, num_steps: 3, eagle_topk: 1, num_draft_tokens: 8}}\n",
         "models.draft: with eagle_topk 1, num_draft_tokens must be num_steps + 1 = 4 (got 8); SGLang would silently rewrite it to 4"),
        (BASE + "models: {target: {path: /m}, draft: {path: /d, algorithm: EAGLE4}}\n",
         "models.draft.algorithm: 'EAGLE4' is not one of EAGLE, EAGLE3, NEXTN, STANDALONE, NGRAM (did you mean 'EAGLE'?)"),
        (BASE + "models: {target: {path: /m}, draft: {algorithm: EAGLE3}}\n",
         "models.draft: path is required for speculative algorithm EAGLE3"),
        (BASE + "models: {draft: {algorithm: NGRAM}}\n", "models.target: required field is missing"),
        (BASE.replace("roles: [prefill]}", "roles: [prefill], overrides: {gpu: {max_tmp_c: 3}}}"),
         "nodes[0].overrides.gpu.max_tmp_c: unknown key 'max_tmp_c' (did you mean 'max_temp_c'?)"),
        (BASE + "router: {listen: 'localhost'}\n", "router.listen: want HOST:PORT, e.g. 127.0.0.1:8000 (an IPv6 host in brackets: [::1]:8000) (got 'localhost')"),
        (BASE + "router: {prefixes: [{name: a, text: x, file: y}]}\n", "router.prefixes[0]: give exactly one of text or file"),
        ("name: t\nnodes: []\n", "nodes: List should have at least 1 item"),
    ],
)
def test_invalid_profiles_name_the_field(text: str, expected: str) -> None:
    errors = _error(text)
    assert any(line.startswith(expected) for line in errors), errors


def test_collocated_profile_needs_no_pd_roles() -> None:
    text = "name: one\ncollocated: true\nnodes:\n  - {name: box, host: h, roles: [prefill, decode]}\n"
    assert parse_profile_text(text).collocated


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "the profile is empty"),
        ("   \n# only a comment\n", "the profile is empty"),
        ("name: [x\n", "not valid YAML at line 2"),
        ("- a\n- b\n", "a profile must be a YAML mapping, got list"),
        ("just a string\n", "a profile must be a YAML mapping, got str"),
        ("name: a\nname: b\n", "duplicate key 'name'"),
        ("\x00\x01binary", "not valid YAML"),
    ],
)
def test_unparseable_profiles(text: str, fragment: str) -> None:
    with pytest.raises(ProfileError) as info:
        parse_profile_text(text, "p.yaml")
    assert fragment in info.value.message
    assert info.value.exit_code == 64


def test_discovery_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    explicit = tmp_path / "a.yaml"
    from_env = tmp_path / "b.yaml"
    for p in (explicit, from_env):
        p.write_text(BASE)
    monkeypatch.chdir(tmp_path)
    assert resolve_profile_path(str(explicit), env={"INFERCTL_PROFILE": str(from_env)}) == explicit
    assert resolve_profile_path(None, env={"INFERCTL_PROFILE": str(from_env)}) == from_env
    with pytest.raises(ProfileError, match=r"no profile given and ./inferctl.yaml does not exist"):
        resolve_profile_path(None, env={})
    (tmp_path / "inferctl.yaml").write_text(BASE)
    assert resolve_profile_path(None, env={}) == Path("inferctl.yaml")
    with pytest.raises(ProfileError, match=r"from \$INFERCTL_PROFILE"):
        resolve_profile_path(None, env={"INFERCTL_PROFILE": str(tmp_path / "missing.yaml")})
    with pytest.raises(ProfileError, match="no built-in profile 'nope'"):
        resolve_profile_path("builtin:nope", env={})
    with pytest.raises(ProfileError, match=r"no built-in profile 'refrence-h100-h200' \(did you mean "
                       r"'builtin:reference-h100-h200'\?\)"):
        resolve_profile_path("builtin:refrence-h100-h200", env={})


def test_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(ProfileError, match="not a UTF-8 text file"):
        load_profile(path)


def test_defaults_are_filled_in() -> None:
    prof = parse_profile_text(BASE)
    assert prof.ssh.host_key_policy == "reject"
    assert prof.sglang.prefill.bootstrap_port == 8998
    assert prof.server_ports(prof.node("pf-01")) == {"prefill": 30000, "bootstrap": 8998}
    assert prof.router.listen_host == "127.0.0.1" and prof.router.listen_port == 8000

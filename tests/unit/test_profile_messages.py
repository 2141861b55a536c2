"""Profile validation says what a field wants, not a raw regex; suggests keys below the top level; lists
literal values without a stray "or,"; and blames a port clash on the fields the user wrote (issue 29,
item 9c)."""

from __future__ import annotations

from typing import Any

import pytest

from infer_ctl.profile.load import ProfileError, parse_profile_text
from infer_ctl.profile.messages import PATTERN_WANTS
from infer_ctl.profile.profile import Profile

BASE = ("name: t\nnodes:\n  - {name: pf-01, host: 10.0.0.1, roles: [prefill]}\n"
        "  - {name: dc-01, host: 10.0.0.2, roles: [decode]}\n")


def _errors(text: str) -> list[str]:
    with pytest.raises(ProfileError) as info:
        parse_profile_text(text, "p.yaml")
    return info.value.errors


def _patterns(schema: Any) -> set[str]:
    if isinstance(schema, dict):
        return {schema["pattern"]} if isinstance(schema.get("pattern"), str) else set().union(
            *(_patterns(v) for v in schema.values()))
    if isinstance(schema, list):
        return set().union(*(_patterns(v) for v in schema))
    return set()


def test_every_pattern_of_the_schema_is_described() -> None:
    patterns = _patterns(Profile.model_json_schema())
    assert len(patterns) >= 10
    assert patterns <= set(PATTERN_WANTS), patterns - set(PATTERN_WANTS)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (BASE.replace("name: pf-01", "name: 'pf 01'"),
         "nodes[0].name: want a name of 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or "
         "digit, e.g. pf-01 (got 'pf 01')"),
        (BASE + "router: {admin_token_env: 9TOKEN}\n",
         "router.admin_token_env: want an environment variable name"),
        (BASE + "router: {tenant_header: X-Tenant}\n",
         "router.tenant_header: want a lower-case HTTP header name of 1 to 64 letters, digits or '-', "
         "e.g. x-inferctl-tenant (got 'X-Tenant')"),
        (BASE + "router: {prefixes: [{name: 'a b', text: x}]}\n",
         "router.prefixes[0].name: want a name of 1 to 128"),
    ],
)
def test_pattern_fields_say_what_they_want(text: str, expected: str) -> None:
    errors = _errors(text)
    assert any(line.startswith(expected) for line in errors), errors
    assert not any("pattern" in line or "^" in line for line in errors), errors


@pytest.mark.parametrize("host", ["user@10.0.0.1", "'10.0.0.1:22'", "'[::1]'", "'10.0.0.1 '", "-oProxyCommand=x", "''"])
def test_a_node_host_is_a_bare_name_or_address(host: str) -> None:
    # a login or port written into the host would reach the resolver as part of the name
    errors = _errors(BASE.replace("host: 10.0.0.1", f"host: {host}"))
    assert any(e.startswith("nodes[0].host: want a host name, IPv4 address or bare IPv6 address") for e in errors), \
        errors


@pytest.mark.parametrize("host", ["pf-01.example.net", "10.0.0.9", "2001:db8::11", "fe80::1%eth0", "my_alias"])
def test_node_hosts_that_ssh_resolves_are_valid(host: str) -> None:
    profile = parse_profile_text(BASE.replace("host: 10.0.0.1", f"host: '{host}'"), "p.yaml")
    assert profile.nodes[0].host == host


def test_a_quoted_number_for_a_number_choice_says_to_drop_the_quotes() -> None:
    (line,) = _errors(BASE + "fabric: {mtu: '4096'}\n")
    assert line == "fabric.mtu: '4096' is a string: write 4096 without quotes (one of 256, 512, 1024, 2048, 4096)"


def test_did_you_mean_below_the_top_level() -> None:
    text = BASE.replace("roles: [decode]}", "roles: [decode], overrides: {gpu: {max_temp: 80}}}")
    assert _errors(text) == [
        "nodes[1].overrides.gpu.max_temp: unknown key 'max_temp' (did you mean 'max_temp_c'?)"]
    text = BASE.replace("roles: [decode]}", "roles: [decode], overrides: {fabric: {mtu: 9000}}}")
    (line,) = _errors(text)
    assert line.startswith("nodes[1].overrides.fabric.mtu: 9000 is not one of 256, 512, 1024, 2048, 4096; ")


def test_mtu_list_and_the_netdev_mtu_hint() -> None:
    (line,) = _errors(BASE + "fabric: {mtu: 1500}\n")
    assert line == ("fabric.mtu: 1500 is not one of 256, 512, 1024, 2048, 4096; fabric.mtu is the "
                    "RoCE/InfiniBand path MTU of the HCA ports; an Ethernet MTU such as 1500 or 9000 belongs "
                    "in fabric.netdev_mtu")


def test_a_port_clash_blames_what_the_user_wrote() -> None:
    # two nodes on one host, both on the default prefill port: the host the user wrote, not an override
    same_host = BASE.replace("roles: [prefill]}", "roles: [prefill]}\n  - {name: pf-02, host: 10.0.0.1, "
                             "roles: [prefill], port: 2222}")
    errors = _errors(same_host)
    assert ("nodes[1].host: server port 10.0.0.1:30000 of pf-02/prefill (the default sglang.prefill.port "
            "30000) collides with pf-01/prefill (the default sglang.prefill.port 30000); nodes 'pf-01' and "
            "'pf-02' share host 10.0.0.1: give nodes[1] its own overrides.prefill_port") in errors
    assert not any("overrides.prefill_port:" in e for e in errors)
    # one node with both roles, decode port written onto the bootstrap default: the field written
    both = BASE.replace("roles: [prefill]}", "roles: [prefill, decode]}") + "sglang: {decode: {port: 8998}}\n"
    assert _errors(both) == [
        "sglang.decode.port: server port 10.0.0.1:8998 of pf-01/decode (sglang.decode.port) collides with "
        "pf-01/bootstrap (the default sglang.prefill.bootstrap_port 8998)"]
    # an override that clashes is blamed itself
    ov = same_host.replace("port: 2222}", "port: 2222, overrides: {prefill_port: 30000, bootstrap_port: 9000}}")
    errors = _errors(ov)
    assert any(e.startswith("nodes[1].overrides.prefill_port: server port 10.0.0.1:30000 of pf-02/prefill "
                            "(nodes[1].overrides.prefill_port) collides") for e in errors), errors

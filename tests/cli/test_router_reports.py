"""`router status|workers|spec|prefixes|tenants` say which router answered and which profile chose it, in
text and JSON, with a real duration; `router prefixes list` is named so."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from infer_ctl.cli.main import main
from infer_ctl.resources import builtin_profile_path
from infer_ctl.router.daemon.embed import RouterHandle, router_config, start_router_in_thread
from infer_ctl.sim.cluster import ThreadedSimCluster, WorkerSpec, start_cluster_in_thread


@pytest.fixture(scope="module")
def cluster() -> Iterator[ThreadedSimCluster]:
    c = start_cluster_in_thread([WorkerSpec("mixed", time_scale=0.01)])
    yield c
    c.stop()


@pytest.fixture
def router(cluster: ThreadedSimCluster) -> Iterator[RouterHandle]:
    with start_router_in_thread(router_config(workers=cluster.urls)) as handle:
        yield handle


def _profile_for(tmp_path: Path, router: RouterHandle) -> Path:
    local = builtin_profile_path("local")
    assert local is not None
    path = tmp_path / "p.yaml"
    path.write_text(local.read_text().replace("listen: 127.0.0.1:8000", f"listen: {router.url.split('//')[1]}"))
    return path


def _doc(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    main([*argv, "--json"])
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("verb", [["status"], ["workers"], ["spec"], ["prefixes"], ["tenants"]], ids=" ".join)
def test_json_names_the_router_url_and_the_profile(verb: list[str], router: RouterHandle, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    doc = _doc(capsys, "router", *verb, "-p", str(_profile_for(tmp_path, router)))
    assert (doc["profile"], doc["router_url"]) == ("local", router.url)
    assert doc["duration_s"] > 0
    monkeypatch.setenv("INFERCTL_PROFILE", str(_profile_for(tmp_path, router)))
    assert _doc(capsys, "router", *verb)["profile"] == "local"  # the same from the variable
    monkeypatch.delenv("INFERCTL_PROFILE")
    doc = _doc(capsys, "router", *verb, "--url", router.url)
    assert (doc["profile"], doc["router_url"]) == (None, router.url)


def test_status_text_says_which_router_and_why(router: RouterHandle, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    main(["router", "status", "-p", str(_profile_for(tmp_path, router))])
    assert capsys.readouterr().out.startswith(f"router {router.url} (profile local): ")
    main(["router", "status", "--url", router.url])
    assert capsys.readouterr().out.startswith(f"router {router.url} (from --url): ")


def test_prefixes_list_is_named_so(router: RouterHandle, capsys: pytest.CaptureFixture[str]) -> None:
    assert _doc(capsys, "router", "prefixes", "--url", router.url)["command"] == "router prefixes list"


def test_bench_duration_is_rounded(router: RouterHandle, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _doc(capsys, "bench", "--url", router.url, "--requests", "3", "-c", "1", "--max-new-tokens", "2")
    s = doc["summary"] if "summary" in doc else doc["data"]["summary"]
    assert s["duration_s"] == round(s["duration_s"], 3)



def test_spec_text_names_a_missing_draft(router: RouterHandle, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode whose /server_info names no draft (NGRAM has none): the pair line said 'draft None'
    (issue 29, item 9d)."""
    from infer_ctl.router.control.client import AdminClient

    real = AdminClient.call

    def no_draft(self: AdminClient, *args: object, **kwargs: object) -> dict:  # type: ignore[type-arg]
        doc = real(self, *args, **kwargs)  # type: ignore[arg-type]
        doc["pairs"] = [{**p, "draft": None} for p in doc["pairs"]]
        return doc

    monkeypatch.setattr(AdminClient, "call", no_draft)
    main(["router", "spec", "--url", router.url])
    out = capsys.readouterr().out
    assert "None" not in out
    assert "/ draft none reported (no speculative_draft_model_path in /server_info): 0 reqs" in out

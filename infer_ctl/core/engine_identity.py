"""What answers at a server's address: SGLang at the version the profile pins, another SGLang, the
simulator, or something that is not SGLang at all. Pure: judged from the `/server_info` answer.

SGLang 0.5.23's `/server_info` (`get_server_info` in sglang/srt/entrypoints/http_server.py) is every
resolved ServerArgs field plus `version` (sglang's `__version__`) and the scheduler's internal states; a
server that is not SGLang either does not serve it (404, HTML) or serves a document without those keys.
inferctl's simulator (infer_ctl/sim) answers SGLang's shape with `"frontend": "inferctl-sim"`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

#: the SGLang release inferctl's launch flags, probes and router are tested against (tests/engine)
TESTED_VERSION = "0.5.23"

#: ServerArgs fields every SGLang 0.5.x reports; a document lacking them is not SGLang's
_SGLANG_KEYS = ("model_path", "tp_size", "port")

Kind = Literal["sglang", "other-version", "simulator", "not-sglang"]


@dataclass(frozen=True)
class Identity:
    kind: Kind
    version: str | None
    #: one line for a finding or a log: what answers, and how that was told
    summary: str


def identify(info: Any, *, pinned: str | None = TESTED_VERSION, status: int = 200) -> Identity:
    """Judge a `/server_info` answer (`info`: the decoded body, `status`: its HTTP status)."""
    if status != 200:
        return Identity("not-sglang", None, f"/server_info answered HTTP {status}: not SGLang 0.5 or later "
                                            "(which serves it; an older SGLang serves /get_server_info)")
    if not isinstance(info, dict):
        return Identity("not-sglang", None, "/server_info is not a JSON object: not an SGLang server")
    version = info.get("version")
    version = version if isinstance(version, str) else None
    missing = [k for k in _SGLANG_KEYS if k not in info]
    if version is None or missing:
        what = "no `version`" if version is None else f"no {', '.join(missing)}"
        return Identity("not-sglang", version, f"/server_info has {what}: not an SGLang server")
    if info.get("frontend") == "inferctl-sim":
        return Identity("simulator", version, f"inferctl's simulator (SGLang {version}-compatible)")
    if pinned and version != pinned:
        return Identity("other-version", version,
                        f"SGLang {version}, not the {pinned} the profile pins (flags, endpoints and KV events "
                        f"are checked against {TESTED_VERSION})")
    return Identity("sglang", version, f"SGLang {version}")

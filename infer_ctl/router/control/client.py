"""The CLI's client for a running router's admin API (bearer token from the profile's env variable)."""

from __future__ import annotations

import os
from typing import Any

import httpx

from infer_ctl.errors import InferctlError
from infer_ctl.exitcodes import ExitCode
from infer_ctl.profile.router import RouterSettings


class RouterUnreachable(InferctlError):
    exit_code = ExitCode.UNKNOWN


class RouterRefused(InferctlError):
    """The router (or a proxy in front of it) answered the admin request with an error `status`."""

    exit_code = ExitCode.FAIL

    def __init__(self, message: str, *, status: int, remedy: str | None = None) -> None:
        super().__init__(message, remedy=remedy)
        self.status = status


#: the router's admin_token_env default (profile/router.py), for a client given no profile
DEFAULT_TOKEN_ENV: str = RouterSettings.model_fields["admin_token_env"].default


class AdminClient:
    def __init__(self, url: str, token_env: str = DEFAULT_TOKEN_ENV, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.token_env = token_env
        token = os.environ.get(token_env)
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout = timeout

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            resp = httpx.request(method, self.url + path, json=body, headers=self.headers, timeout=self.timeout)
        except httpx.HTTPError as exc:
            raise RouterUnreachable(
                f"router at {self.url} is not reachable: {exc}",
                remedy="start it with `inferctl router serve`, or point --url at it",
            ) from None
        try:
            doc = resp.json()
        except ValueError:
            doc = {"error": {"message": resp.text[:200]}}
            if resp.status_code < 400:
                doc = None
        if not isinstance(doc, dict) and resp.status_code < 400:
            # the admin API answers JSON objects: what answered is not it (a proxy's maintenance page, another
            # service on the port). Taken as an answer, a `[]` read as an empty fleet (a round "ok" with
            # nothing observed) and a string or number was an internal error
            raise RouterUnreachable(
                f"router at {self.url} is not reachable: {method} {path} answered {resp.status_code} with "
                f"{resp.text[:80]!r}, not the router's JSON",
                remedy="check that --url (or the profile's router.listen) is the inferctl router's address, "
                       "not a proxy or another service")
        if not isinstance(doc, dict) and resp.status_code >= 400:
            # a proxy's 503 with a JSON body that is not an object (`"Service Unavailable"`, `[...]`, null)
            # was an internal error (AttributeError) that ended a loop meant to outlive it
            doc = {"error": {"message": resp.text[:200]}}
        if resp.status_code == 401:
            raise RouterRefused(f"router at {self.url} refused the admin request (401 unauthorized)",
                                remedy=f"export {self.token_env} with the router's admin token", status=401)
        if resp.status_code >= 400:
            msg = doc.get("error", {}).get("message") if isinstance(doc.get("error"), dict) else str(doc)
            raise RouterRefused(f"router answered {resp.status_code}: {msg}",
                                remedy="see `inferctl router status`", status=resp.status_code)
        return dict(doc)

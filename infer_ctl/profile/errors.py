"""Turn pydantic validation errors into one line per problem, naming the field path and suggesting
the closest valid key or value ("did you mean ...")."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from infer_ctl.profile.messages import error_message, format_loc
from infer_ctl.profile.profile import CrossFieldErrors


def format_error(root: type[BaseModel], err: Any) -> list[str]:
    exc = (err.get("ctx") or {}).get("error")
    if isinstance(exc, CrossFieldErrors):
        return [f"{format_loc((*err['loc'], *p.loc))}: {p.message}" for p in exc.problems]
    return [f"{format_loc(err['loc'])}: {error_message(root, err)}"]


def format_validation_error(root: type[BaseModel], exc: ValidationError) -> list[str]:
    lines: list[str] = []
    for err in exc.errors():
        for line in format_error(root, err):
            if line not in lines:
                lines.append(line)
    return lines

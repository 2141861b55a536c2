"""Finding, reading and validating a profile file.

Discovery order: an explicit path (`--profile/-p`), then `$INFERCTL_PROFILE`, then `./inferctl.yaml`.
`builtin:<name>` names a profile shipped with inferctl (e.g. `builtin:local`).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from infer_ctl.errors import ProfileError
from infer_ctl.profile.errors import format_validation_error
from infer_ctl.profile.profile import Profile
from infer_ctl.resources import builtin_profile_names, builtin_profile_path

ENV_VAR = "INFERCTL_PROFILE"
DEFAULT_FILE = "inferctl.yaml"


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys: PyYAML silently keeps the last one, which hides typos."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    mapping: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in mapping:
            mark = key_node.start_mark
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (line {mark.line + 1})", mark
            )
        mapping[key] = loader.construct_object(value_node, deep=deep)
    return mapping


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def resolve_profile_path(
    explicit: str | os.PathLike[str] | None, env: Mapping[str, str] | None = None
) -> Path:
    env = os.environ if env is None else env
    source = "--profile"
    candidate: str | os.PathLike[str] | None = explicit
    if candidate is None and env.get(ENV_VAR):
        candidate, source = env[ENV_VAR], f"${ENV_VAR}"
    if candidate is None:
        candidate, source = DEFAULT_FILE, "the default"
    text = os.fspath(candidate)
    if text.startswith("builtin:"):
        name = text.removeprefix("builtin:")
        path = builtin_profile_path(name)
        if path is None:
            close = difflib.get_close_matches(name, builtin_profile_names(), n=1)
            raise ProfileError(
                f"no built-in profile {name!r}" + (f" (did you mean 'builtin:{close[0]}'?)" if close else ""),
                remedy=f"choose one of: {', '.join('builtin:' + n for n in builtin_profile_names())}",
            )
        return path
    path = Path(text).expanduser()
    if not path.is_file():
        if source == "the default":
            raise ProfileError(
                f"no profile given and ./{DEFAULT_FILE} does not exist",
                remedy=f"pass --profile PATH, set ${ENV_VAR}, or try --profile builtin:local",
            )
        raise ProfileError(
            f"profile {path} (from {source}) does not exist or is not a file",
            remedy="check the path, or try --profile builtin:local (the shipped simulated cluster)",
        )
    return path


def parse_profile_text(text: str, origin: str = "<profile>") -> Profile:
    if not text.strip():
        raise ProfileError(f"{origin}: the profile is empty", remedy="start from profiles/local.yaml")
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        raise ProfileError(
            f"{origin}: not valid YAML at {where}: {exc.problem or exc}", remedy="fix the YAML syntax"
        ) from None
    except yaml.YAMLError as exc:
        raise ProfileError(f"{origin}: not valid YAML: {exc}", remedy="fix the YAML syntax") from None
    if data is None:  # only comments / blank lines
        raise ProfileError(f"{origin}: the profile is empty", remedy="start from profiles/local.yaml")
    if not isinstance(data, dict):
        kind = "empty" if data is None else type(data).__name__
        raise ProfileError(
            f"{origin}: a profile must be a YAML mapping, got {kind}", remedy="start from profiles/local.yaml"
        )
    return validate_profile_data(data, origin)


def validate_profile_data(data: dict[str, Any], origin: str = "<profile>") -> Profile:
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        lines = format_validation_error(Profile, exc)
        first = lines[0]
        more = f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""
        # No generic remedy line: the message names the field and, where it can, the fix.
        hint = None if len(lines) == 1 else "`inferctl profile validate` lists every problem"
        raise ProfileError(f"{origin}: {first}{more}", errors=lines, remedy=hint) from None


def load_profile(
    explicit: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> Profile:
    path = resolve_profile_path(explicit, env)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ProfileError(f"{path}: not a UTF-8 text file", remedy="a profile is a YAML text file") from None
    except OSError as exc:
        raise ProfileError(
            f"{path}: cannot read: {exc.strerror}", remedy="check the path and permissions"
        ) from None
    profile = parse_profile_text(text, str(path))
    return profile.with_base_dir(path.resolve().parent)

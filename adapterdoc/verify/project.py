"""``[tool.adapterdoc]`` in the nearest ``pyproject.toml``: a project's defaults for `adapterdoc verify`
(``--profile``, ``--max-lora-rank``, ``--lora-target-modules``, ``--base``, ``--served-as``, ``--max-inert-share``).

The command passes what was given on its command line; :func:`verify_settings` fills the rest from the table and
checks it, so the command only parses, calls and renders. A bad table value is an input error (exit 3) naming the
file and the key; a typo such as ``profle`` is refused, never silently ignored.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from adapterdoc.engines import PROFILES
from adapterdoc.engines.served import SERVED_AS
from adapterdoc.engines.sglang import split_targets
from adapterdoc.errors import ConfigError
from adapterdoc.verify.options import VerifyOptions

TABLE_KEYS = {
    "profile": "profile",
    "max-lora-rank": "max_lora_rank",
    "lora-target-modules": "lora_target_modules",
    "base": "base",
    "served-as": "served_as",
    "max-inert-share": "max_inert_share",
}
"""``[tool.adapterdoc]`` keys (underscores accepted too) → option names."""


def _unknown_table_key(key: str) -> str:
    import difflib

    known = sorted(TABLE_KEYS)
    close = difflib.get_close_matches(key.replace("_", "-"), known, n=1, cutoff=0.6)
    guess = f"did you mean {close[0]}? " if close else ""
    return f"unknown key `{key}` in [tool.adapterdoc]; {guess}known keys: {', '.join(known)}"


def find_pyproject(start: str | None = None) -> str | None:
    """The nearest ``pyproject.toml`` at or above ``start`` (the working directory)."""
    here = os.path.abspath(start or os.getcwd())
    while True:
        candidate = os.path.join(here, "pyproject.toml")
        if os.path.isfile(candidate):
            return candidate
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


def project_defaults(start: str | None = None) -> dict[str, object]:
    """``[tool.adapterdoc]`` of the nearest pyproject.toml, as option names; a relative ``base`` path is taken
    relative to that file. An unknown key is an error (exit 3) naming the key and the known ones: a typo such as
    ``profle`` must not silently run the default profile."""
    path = find_pyproject(start)
    if path is None:
        return {}
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        try:
            import tomli as tomllib
        except ImportError:
            return {}
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:  # TOML is UTF-8 only
        raise ConfigError(path, f"cannot read [tool.adapterdoc]: {e}") from None
    tool = data.get("tool", {})
    table = tool.get("adapterdoc", {}) if isinstance(tool, dict) else None
    if not isinstance(table, dict):
        raise ConfigError(path, "[tool.adapterdoc] must be a table")
    out: dict[str, object] = {}
    for key, value in table.items():
        name = TABLE_KEYS.get(key.replace("_", "-"))
        if name is None:
            raise ConfigError(path, _unknown_table_key(key))
        out[name] = value
    if "profile" in out and out["profile"] not in PROFILES:
        raise ConfigError(path, f"[tool.adapterdoc] profile must be one of {', '.join(PROFILES)}")
    if "served_as" in out and out["served_as"] not in SERVED_AS:
        raise ConfigError(path, "[tool.adapterdoc] served-as must be text or vl")
    rank = out.get("max_lora_rank")
    if "max_lora_rank" in out and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 1):
        raise ConfigError(path, "[tool.adapterdoc] max-lora-rank must be a positive integer")
    if "lora_target_modules" in out:
        mods = out["lora_target_modules"]
        if isinstance(mods, str) or (isinstance(mods, list) and all(isinstance(m, str) for m in mods)):
            out["lora_target_modules"] = split_targets(mods)
        else:
            raise ConfigError(
                path, "[tool.adapterdoc] lora-target-modules must be a list of names or a string"
            )
    share = out.get("max_inert_share")
    if "max_inert_share" in out and (
        isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1
    ):
        raise ConfigError(path, "[tool.adapterdoc] max-inert-share must be a number from 0 to 1")
    if "base" in out:
        base = out["base"]
        if not isinstance(base, str) or not base:
            raise ConfigError(path, "[tool.adapterdoc] base must be a string")
        rel = os.path.join(os.path.dirname(path), base)
        if not base.startswith("tiny:") and not os.path.isabs(base) and os.path.exists(rel):
            out["base"] = rel
    return out


def project_base(base: str | None, defaults: Mapping[str, object]) -> str | None:
    """``--base`` as given, else the table's ``base`` (already checked to be a string)."""
    table = defaults.get("base")
    return base or (table if isinstance(table, str) else None)


def verify_settings(
    defaults: Mapping[str, object],
    *,
    profile: str | None,
    max_lora_rank: int | None,
    lora_target_modules: Sequence[str],
    served_as: str | None,
    load: bool,
    scan: str,
    max_inert_share: float | None,
) -> VerifyOptions:
    """The run's :class:`VerifyOptions`: each option from the command line, else from ``defaults`` (the table).
    A table value the running profile cannot use is a :class:`ConfigError` naming the file (exit 3); a command-line
    value it cannot use stays a ``ValueError`` (the command's usage error)."""
    targets = split_targets(list(lora_target_modules)) if lora_target_modules else None
    from_table = [
        name
        for name, flag in (("max_lora_rank", max_lora_rank), ("lora_target_modules", targets))
        if flag is None and name in defaults
    ]
    d: Mapping[str, object] = defaults  # values checked by project_defaults
    try:
        return VerifyOptions(
            profile=profile or d.get("profile", "peft"),  # type: ignore[arg-type]
            max_lora_rank=max_lora_rank or d.get("max_lora_rank"),  # type: ignore[arg-type]
            lora_target_modules=targets or d.get("lora_target_modules"),  # type: ignore[arg-type]
            served_as=served_as or d.get("served_as"),  # type: ignore[arg-type]
            load=load,
            scan=scan,
            max_inert_share=max_inert_share if max_inert_share is not None else d.get("max_inert_share"),  # type: ignore[arg-type]
        )
    except ValueError as e:
        bad = next((n for n in from_table if str(e).startswith(n)), None)
        if bad:  # a [tool.adapterdoc] value the running profile cannot use: an input error, as for the others
            raise ConfigError(
                find_pyproject() or "pyproject.toml",
                f"[tool.adapterdoc] {str(e).replace(bad, bad.replace('_', '-'), 1)}",
            ) from None
        raise

"""``[tool.adapterdoc]`` in the nearest ``pyproject.toml``: a project's defaults for `adapterdoc verify`
(``--profile``, ``--base``, ``--max-inert-share`` and the engine options the engines declare,
:data:`adapterdoc.engines.options.OPTIONS`: ``--max-lora-rank``, ``--lora-target-modules``, ``--served-as``).

The command passes what was given on its command line; :func:`verify_settings` fills the rest from the table and
checks it, so the command only parses, calls and renders. A bad table value is an input error (exit 3) naming the
file and the key; a typo such as ``profle`` is refused, never silently ignored.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import cast

from adapterdoc.engines import PROFILES
from adapterdoc.engines.options import OPTIONS
from adapterdoc.errors import ConfigError
from adapterdoc.verify.options import VerifyOptions

TABLE_KEYS = {
    "profile": "profile",
    **{o.key: o.name for o in OPTIONS},
    "base": "base",
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
    for o in OPTIONS:
        if o.name in out:
            try:
                out[o.name] = o.from_table(out[o.name])
            except ValueError as e:
                raise ConfigError(path, f"[tool.adapterdoc] {o.key} {e}") from None
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
    engine_options: Mapping[str, object],
    load: bool,
    scan: str,
    max_inert_share: float | None,
) -> VerifyOptions:
    """The run's :class:`VerifyOptions`: each option from the command line (``engine_options``: the engine options'
    values by name, as click gives them), else from ``defaults`` (the table). A table value the running profile
    cannot use is a :class:`ConfigError` naming the file (exit 3); a command-line value it cannot use stays a
    ``ValueError`` (the command's usage error)."""
    given = {o.name: o.from_command_line(engine_options.get(o.name)) for o in OPTIONS}
    from_table = [name for name, value in given.items() if value is None and name in defaults]
    engine = {name: defaults.get(name) if value is None else value for name, value in given.items()}
    share = max_inert_share if max_inert_share is not None else defaults.get("max_inert_share")
    try:
        return VerifyOptions(
            profile or cast(str, defaults.get("profile", "peft")),  # table values checked by project_defaults
            load=load,
            scan=scan,
            max_inert_share=cast("float | None", share),
            engine_options=engine,
        )
    except ValueError as e:
        bad = next((n for n in from_table if str(e).startswith(n)), None)
        if bad:  # a [tool.adapterdoc] value the running profile cannot use: an input error, as for the others
            raise ConfigError(
                find_pyproject() or "pyproject.toml",
                f"[tool.adapterdoc] {str(e).replace(bad, bad.replace('_', '-'), 1)}",
            ) from None
        raise

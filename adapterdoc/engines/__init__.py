"""The serving engines and loaders ``verify --profile`` and ``remap --for`` know: one module per engine (``peft``,
``vllm``, ``sglang``, ``tgi``, ``lorax``), each holding its :class:`Profile` (verify rules, ``needs()`` and the
rules ``remap --for`` asks it, the options it reads), and :data:`NAMES`, the only list of engine names.

A new engine is a new module here (defining ``PROFILE``) plus its name in :data:`NAMES`; verify, remap and the
command line take it from there. Findings of its own need their codes in ``adapterdoc/codes/ENGINE.py`` (appended in
``codes/serving.py``); an option no engine declares yet is one entry in :data:`adapterdoc.engines.options.OPTIONS`.
verify and remap import this package; it imports neither. The modules are imported on first use of
:data:`PROFILES`, so that reading :data:`NAMES` (the command line's choices) costs nothing at start-up.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from adapterdoc.engines.base import Profile

NAMES: tuple[str, ...] = ("peft", "vllm", "sglang", "tgi", "lorax")
"""Every engine, in the order ``--profile`` lists them; the first is the default. ``adapterdoc.engines.<name>`` is
each one's module."""

SERVING = tuple(n for n in NAMES if n != "peft")
"""The engines ``remap --for`` rewrites for (every one but PEFT itself, the default loader)."""

_PROFILES: dict[str, Profile] | None = None


def _profiles() -> dict[str, Profile]:
    global _PROFILES
    if _PROFILES is None:
        _PROFILES = {n: importlib.import_module(f"adapterdoc.engines.{n}").PROFILE for n in NAMES}
    return _PROFILES


def get_profile(name: str) -> Profile:
    """The registered profile ``name``; ``ValueError`` naming the known ones otherwise."""
    try:
        return _profiles()[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; choose from {', '.join(_profiles())}") from None


def profile_names() -> tuple[str, ...]:
    return tuple(_profiles())


def register(profile: Profile) -> Profile:
    """Add (or replace) a profile under its name (a plugin, or a test's); returns it."""
    _profiles()[profile.name] = profile
    return profile


def __getattr__(name: str) -> Any:
    if name == "PROFILES":
        return _profiles()
    if name == "Profile":
        from adapterdoc.engines.base import Profile

        return Profile
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

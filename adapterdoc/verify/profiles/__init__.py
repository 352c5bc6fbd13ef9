"""The verify profiles: one module per loader or server, each holding one :class:`Profile`, and the registry
``verify --profile`` chooses from. A new engine is a new module here plus its line in :data:`PROFILES`."""

from __future__ import annotations

from adapterdoc.verify.profiles import lorax, peft, sglang, tgi, vllm
from adapterdoc.verify.profiles.base import Profile

PROFILES: dict[str, Profile] = {
    p.name: p for p in (peft.PROFILE, vllm.PROFILE, sglang.PROFILE, tgi.PROFILE, lorax.PROFILE)
}
"""Name → profile, in the order ``--profile`` lists them (the first is the default)."""


def get_profile(name: str) -> Profile:
    """The registered profile ``name``; ``ValueError`` naming the known ones otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; choose from {', '.join(PROFILES)}") from None


def profile_names() -> tuple[str, ...]:
    return tuple(PROFILES)


def register(profile: Profile) -> Profile:
    """Add (or replace) a profile under its name; returns it."""
    PROFILES[profile.name] = profile
    return profile

"""The options of one ``verify`` run, checked when they are made (the profiles check the options they read)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from adapterdoc.engines import PROFILES, get_profile
from adapterdoc.engines.base import Profile
from adapterdoc.engines.options import OPTIONS

SCAN_MODES = ("all", "lora-b", "nonzero")
"""``all``: every tensor for NaN/Inf and every lora_B for zeros; ``lora-b``: lora_B only (zeros and NaN/Inf);
``nonzero``: lora_B zeros only, each scan ending at its first non-zero element."""


@dataclass(frozen=True, init=False)
class VerifyOptions:
    """What ``verify`` checks and against which engine (the command's options, resolved).

    ``VerifyOptions(profile="vllm", max_lora_rank=64)``: the engine options (:data:`adapterdoc.engines.options.OPTIONS`,
    declared by the engines) are keyword arguments by name, or one ``engine_options`` mapping."""

    profile: str
    """A name in :data:`adapterdoc.engines.PROFILES`."""
    engine_options: Mapping[str, object]
    """Every engine option's value by name: as given, else the running profile's default
    (:attr:`~adapterdoc.engines.base.Profile.option_defaults`), else the option's own (``max_lora_rank``: vLLM's
    16; SGLang's is ``None``: no ceiling, no rank finding)."""
    load: bool
    scan: str
    max_inert_share: float | None
    """Fail (AD313) when more than this share of the LoRA modules is inert (the weights audit)."""
    expected_keys: str
    """``auto``: the registry's torch-free expected keys where it describes the base exactly, else the meta device;
    ``meta-device``: always PEFT on the meta device (the oracle the registry is tested against)."""

    def __init__(
        self,
        profile: str = "peft",
        *,
        load: bool = False,
        scan: str = "all",
        max_inert_share: float | None = None,
        expected_keys: str = "auto",
        engine_options: Mapping[str, object] | None = None,
        **given: object,
    ) -> None:
        values = {**(engine_options or {}), **given}
        unknown = sorted(set(values) - {o.name for o in OPTIONS})
        if unknown:
            raise TypeError(f"VerifyOptions() got an unexpected keyword argument {unknown[0]!r}")
        running = get_profile(profile)
        resolved: dict[str, object] = {}
        for o in OPTIONS:
            value = values.get(o.name)
            resolved[o.name] = o.checked(
                running.option_defaults.get(o.name, o.default) if value is None else value
            )
        for name, value in (
            ("profile", profile),
            ("engine_options", resolved),
            ("load", load),
            ("scan", scan),
            ("max_inert_share", max_inert_share),
            ("expected_keys", expected_keys),
        ):
            object.__setattr__(self, name, value)  # a frozen dataclass sets its fields once, here
        for p in PROFILES.values():
            p.check_options(self)
        if self.expected_keys not in ("auto", "meta-device"):
            raise ValueError(f"expected_keys must be auto or meta-device, got {self.expected_keys!r}")
        if self.scan not in SCAN_MODES:
            raise ValueError(f"scan must be one of {', '.join(SCAN_MODES)}, got {self.scan!r}")
        share = self.max_inert_share
        if share is not None and (
            isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1
        ):
            raise ValueError(f"max_inert_share must be a number from 0 to 1, got {share!r}")

    @property
    def profile_rules(self) -> Profile:
        """The :class:`~adapterdoc.engines.base.Profile` this run applies."""
        return get_profile(self.profile)

    @property
    def served_as(self) -> str | None:
        """How the engine serves the base, as given (the run's ``served_as`` in JSON; ``None``: inferred)."""
        value = self.engine_options["served_as"]
        return value if isinstance(value, str) else None

    def profile_fields(self) -> dict[str, object]:
        """The run-level JSON keys of every registered profile, filled in by the one that runs."""
        out: dict[str, object] = {}
        for p in PROFILES.values():
            for key, value in p.run_fields(self, active=p.name == self.profile).items():
                if value is not None or key not in out:  # a key two profiles share: the running one's value
                    out[key] = value
        return out

    def profile_label(self) -> str:
        """The profile as the text report's header names it (``peft``; ``vllm 0.33.0, max LoRA rank 16``)."""
        return get_profile(self.profile).label(self)

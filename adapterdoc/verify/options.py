"""The options of one ``verify`` run, checked when they are made (the profiles check the options they read)."""

from __future__ import annotations

from dataclasses import dataclass

from adapterdoc.engines import PROFILES, get_profile
from adapterdoc.engines.base import Profile
from adapterdoc.engines.served import SERVED_AS
from adapterdoc.engines.vllm import VLLM_DEFAULT_MAX_LORA_RANK

SCAN_MODES = ("all", "lora-b", "nonzero")
"""``all``: every tensor for NaN/Inf and every lora_B for zeros; ``lora-b``: lora_B only (zeros and NaN/Inf);
``nonzero``: lora_B zeros only, each scan ending at its first non-zero element."""


@dataclass(frozen=True)
class VerifyOptions:
    """What ``verify`` checks and against which engine (the command's options, resolved)."""

    profile: str = "peft"
    """A name in :data:`adapterdoc.engines.PROFILES`."""
    max_lora_rank: int | None = None
    """The server's ``--max-lora-rank``. ``None`` (not given) becomes the running profile's default: vLLM's 16,
    except for a profile whose ``default_max_lora_rank`` is ``None`` (SGLang: no ceiling, no rank finding)."""
    lora_target_modules: tuple[str, ...] | None = None
    """The server's ``--lora-target-modules`` (the SGLang profile); ``None``: inferred from the adapter."""
    served_as: str | None = None
    """``text`` or ``vl``; ``None`` infers it from the base."""
    load: bool = False
    scan: str = "all"
    max_inert_share: float | None = None
    """Fail (AD313) when more than this share of the LoRA modules is inert (the weights audit)."""
    expected_keys: str = "auto"
    """``auto``: the registry's torch-free expected keys where it describes the base exactly, else the meta device;
    ``meta-device``: always PEFT on the meta device (the oracle the registry is tested against)."""

    def __post_init__(self) -> None:
        running = get_profile(self.profile)
        if self.max_lora_rank is None:
            # the profile's default, set once as the options are made
            object.__setattr__(
                self, "max_lora_rank", getattr(running, "default_max_lora_rank", VLLM_DEFAULT_MAX_LORA_RANK)
            )
        rank = self.max_lora_rank
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 1):
            raise ValueError(f"max_lora_rank must be a positive integer, got {rank!r}")
        if self.lora_target_modules is not None:
            object.__setattr__(self, "lora_target_modules", tuple(self.lora_target_modules))
        for p in PROFILES.values():
            p.check_options(self)
        if self.served_as not in (None, *SERVED_AS):
            raise ValueError(f"served_as must be text or vl, got {self.served_as!r}")
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

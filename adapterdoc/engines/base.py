"""The interface of a verify profile: the rules one loader or server adds on top of verify's own checks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

if TYPE_CHECKING:
    from adapterdoc.adapter import AdapterConfig, LoraKey
    from adapterdoc.engines.zero_lora import FillInput, ZeroLora
    from adapterdoc.ml.meta import ExpectedModel
    from adapterdoc.quant import Quantization, QuantizedModule
    from adapterdoc.report.findings import Finding
    from adapterdoc.report.verify_report import VerifySubject


class ProfileOptions(Protocol):
    """What the profiles read of verify's options (:class:`adapterdoc.verify.options.VerifyOptions`; engines
    import no verify module): the running profile's name and the engine options' values by name (read them with
    :meth:`adapterdoc.engines.options.EngineOption.of`)."""

    @property
    def profile(self) -> str: ...

    @property
    def engine_options(self) -> Mapping[str, object]: ...

    @property
    def profile_rules(self) -> Profile: ...


@dataclass(frozen=True)
class ProfileInput:
    """What a profile's rules read of one adapter: ``spec`` as given, what verify knows of it (``subject``: path,
    layout, candidates, the config summary, ``keys_against``), the parsed keys, the expected model (``meta``:
    registry or meta device, as the engine names its keys), the options and the adapter config
    (``subject.config["inferred"]`` says whether it was inferred)."""

    spec: str
    subject: VerifySubject
    keys: list[LoraKey]
    meta: ExpectedModel
    options: ProfileOptions
    config: AdapterConfig


@dataclass(frozen=True)
class ProfileCheck:
    """A profile's result on one adapter: its findings and how the engine serves the base (the report's
    ``served_as``: ``text``, ``vl`` or ``None`` when the profile does not say)."""

    findings: tuple[Finding, ...]
    served_as: str | None = None


@dataclass(frozen=True)
class EngineNeeds:
    """What one serving engine needs an adapter to look like, as data: ``remap --for ENGINE`` makes every exact
    rewrite these fields ask for, and the engine's profile fails an adapter that does not have them."""

    keys: str = "as-is"
    """``as-is`` (the engine matches keys loosely), ``text`` (exact text-style keys
    ``base_model.model.model.layers.{i}...``: the language model's keys with no wrapper) or ``served`` (the layout of
    the model class the engine serves, as the profile's ``served_as`` says)."""
    experts: str | None = None
    """The expert layout the engine reads (``per-expert`` or ``fused``); ``None``: either, or no expert LoRA at
    all (see :attr:`expert_lora`)."""
    expert_lora: bool = True
    """Whether the engine applies expert LoRA at all (``False``: expert keys are dropped)."""
    rslora: bool = True
    """Whether ``use_rslora`` is honoured; ``False``: fold it into ``lora_alpha`` (``alpha * sqrt(r)``)."""
    patterns: bool = True
    """Whether ``rank_pattern`` / ``alpha_pattern`` are honoured; ``False``: uniform rank and scaling."""
    regex_targets: bool = True
    """Whether a regex (string) ``target_modules`` is accepted; ``False``: the explicit list."""
    dora: bool = False
    """Whether DoRA (``use_dora``) is served; ``False``: refused, there is no exact rewrite."""
    modules_to_save: bool = False
    """Whether ``modules_to_save`` tensors are applied; ``False``: refused, there is no exact rewrite."""
    embedding_copies: bool = False
    """Whether the engine applies LoRA on ``embed_tokens`` / ``lm_head`` and skips PEFT's ``base_layer.weight``
    copy saved beside it (SGLang): the copy is then no ``modules_to_save`` tensor, and is refused only where it
    differs from the base's weight (``--base`` with weights). Reported; the rule is the profile's
    :meth:`Profile.skipped_copies`."""
    lora_bias: bool = True
    """Whether ``lora_B.bias`` tensors (``lora_bias=True``) are applied; ``False``: refused, no exact rewrite."""
    modules_to_save_heads: tuple[str, ...] = ()
    """``modules_to_save`` entries served even when :attr:`modules_to_save` is false (vLLM: the ``classifier`` /
    ``score`` heads of classification models)."""
    version: str = ""
    """The engine release or commit these needs were read from."""
    rank_padding: tuple[int, int] | None = None
    """``(minimum, block)`` when the engine pads every rank at or below ``minimum`` to ``minimum`` and every other
    to the next multiple of ``block`` and then scales layer types with the padded rank (TGI, LoRAX): make every
    rank one it does not pad, zero-padding lora_A/lora_B and scaling ``lora_alpha`` so that each module keeps
    PEFT's scaling exactly. ``None``: ranks are served as they are."""
    fill: str | None = None
    """The name of the zero LoRA rule the profile's :meth:`Profile.zero_lora` applies (the ``fill`` of the report's
    ``rewrites`` entry): ``layer-types`` (the engine drops a layer type unless every layer has it, TGI and LoRAX:
    the type is added on the layers that lack it), ``sglang-pairs`` (the partners SGLang stacks: ``v_proj`` (and
    ``k_proj``) for a ``q_proj``, ``q_proj`` for a ``k_proj`` / ``v_proj``, ``gate_proj`` for an ``up_proj``).
    ``None``: nothing is added."""


@dataclass(frozen=True)
class CopyCheck:
    """One whole-weight copy of a base weight that an engine skips (PEFT's ``base_layer.weight`` beside LoRA on
    ``embed_tokens`` / ``lm_head``) and what comparing it with the base's weight found."""

    key: str
    head: str
    """``embed_tokens`` or ``lm_head``."""
    verdict: str
    """``equal``, ``differs``, ``shape`` (a resized vocabulary: the shapes differ) or ``unchecked``."""
    detail: str


def engine_finding(
    engine: str, code: str, spec: str, msg: str, *, key: str | None = None, hint: str | None = None
) -> Finding:
    """A profile's finding on ``spec``: its message names the engine and the release its rules describe
    (``engine``: ``vLLM 0.33.0``)."""
    from adapterdoc.report.findings import make

    return make(code, f"{engine}: {msg}", path=spec, key=key, hint=hint)


class Profile:
    """One ``verify --profile NAME`` and ``remap --for NAME``: a name, the options it reads, its findings, its
    run-level JSON keys, and for a serving engine what ``remap --for`` makes of an adapter (:meth:`needs`, as data;
    :meth:`unservable`, :meth:`zero_lora`, :meth:`skipped_copies`, :meth:`drops_partial_layer_types`, its own
    rules). Every method has a default here: an engine overrides what it does differently.

    Subclass it in a module of its own under :mod:`adapterdoc.engines`, make one instance and list it in
    that package's registry. Import what the rules need inside the methods: the registry is read when the
    command line starts."""

    name: str = ""
    summary: str = ""
    """What it checks, for ``--profile``'s help (e.g. ``vLLM serving``)."""
    options: tuple[str, ...] = ()
    """The engine options it reads, by name (declared in :data:`adapterdoc.engines.options.OPTIONS`)."""
    option_defaults: ClassVar[Mapping[str, object]] = {}
    """The value of an option it reads when neither the command line nor the table gives one and this profile runs,
    where it is not the option's own default (SGLang: no ``--max-lora-rank``)."""
    option_help: ClassVar[Mapping[str, str]] = {}
    """Its clause in an option's ``--help`` (``max_lora_rank``: ``vLLM one of 1, 8, ... (default 16)``)."""

    def check_options(self, options: ProfileOptions) -> None:
        """Raise ``ValueError`` for a value of one of its options it cannot use. Every profile checks its own
        options whichever profile runs, so that a bad value fails the same way always."""

    def check(
        self,
        subject: VerifySubject,
        keys: list[LoraKey],
        meta: ExpectedModel,
        options: ProfileOptions,
        config: AdapterConfig,
    ) -> ProfileCheck:
        """Its result on one adapter: :meth:`findings` and :meth:`served_as`."""
        found = self.findings(subject.adapter, subject, keys, meta, options, config)
        return ProfileCheck(tuple(found), self.served_as(meta, options))

    def findings(
        self,
        spec: str,
        report: VerifySubject,
        keys: list[LoraKey],
        meta: ExpectedModel,
        options: ProfileOptions,
        config: AdapterConfig,
    ) -> list[Finding]:
        """Its findings on one adapter (the arguments are :class:`ProfileInput`'s; ``report`` is its ``subject``).
        A profile overrides this or :meth:`rules`."""
        return self.rules(ProfileInput(spec, report, keys, meta, options, config))

    def rules(self, a: ProfileInput) -> list[Finding]:
        """Its findings on one adapter, from one :class:`ProfileInput`."""
        return []

    def served_as(self, meta: ExpectedModel, options: ProfileOptions) -> str | None:
        """How the engine serves the base (``text`` or ``vl``), for the report's ``served_as``; ``None``: the
        profile does not say."""
        return None

    def run_fields(self, options: ProfileOptions, *, active: bool) -> dict[str, object]:
        """The keys it adds to the run's JSON after ``profile``; every run has them, ``None`` when ``active`` is
        false (another profile ran)."""
        return {}

    def needs(self, base_layout: str | None, options: ProfileOptions | None = None) -> EngineNeeds | None:
        """What ``remap --for NAME`` rewrites an adapter into for a base of registry layout ``base_layout``
        (``None``: unknown); ``None`` when this profile is not a serving engine (``remap --for`` refuses it)."""
        return None

    def keys_against(self, base_layout: str | None, options: ProfileOptions | None = None) -> str | None:
        """The view of a base of registry layout ``base_layout`` that the adapter's keys are checked against
        under this profile (missing, unexpected and shape: AD220-AD223): ``text``, the base's text model with the
        names the engine reads (the registry's text counterpart of a VL layout, towers dropped:
        :func:`adapterdoc.verify.base.keys_view`); ``None``, the model PEFT builds on the base."""
        return None

    def unservable(
        self, config: Mapping[str, object], modules: list[str], model_type: str | None
    ) -> str | None:
        """Why the engine cannot apply an adapter with this ``adapter_config.json`` (``config``, a dict) and these
        LoRA module paths on a base of ``model_type`` (``None``: unknown), whatever ``remap --for`` rewrites;
        ``None`` when nothing stands in the way. ``remap --for`` refuses with it (AD270)."""
        return None

    def zero_lora(self, a: FillInput) -> ZeroLora | None:
        """The zero LoRA (``B A = 0``: PEFT's outputs unchanged) ``remap --for`` adds so that the engine loads what it
        would drop or fail on, from the adapter's factors and its base (:class:`~adapterdoc.engines.zero_lora.FillInput`);
        ``None`` (the default): nothing to add. Raise :class:`~adapterdoc.errors.RefusedError` (AD269) when no fill
        can make the engine load the adapter. :attr:`EngineNeeds.fill` names the rule in the report."""
        return None

    def drops_partial_layer_types(self) -> bool:
        """Whether the engine drops a LoRA layer type unless every layer has it (TGI, LoRAX): ``remap --for``'s
        refusal of a layer type the base lacks in some layers does not suggest such an engine instead."""
        return False

    def skipped_copies(self, keys: list[LoraKey], adapter_root: str, base: str | None) -> list[CopyCheck]:
        """PEFT's whole-weight copies of base weights among ``keys`` that the engine skips, serving the base's own
        weight (SGLang: ``base_layer.weight`` beside LoRA on ``embed_tokens`` / ``lm_head``), each compared with the
        base's (``base``: ``--base`` as given). ``remap --for`` keeps them as they are (no ``modules_to_save``) and
        refuses the adapter where one differs (AD490). The default: none."""
        return []

    def quantized_base(
        self, spec: str, q: Quantization, quantized: Sequence[QuantizedModule]
    ) -> list[Finding]:
        """Its findings on adapter ``spec`` verified against a quantized base (``q``; ``quantized``: the modules
        the adapter targets that the base stores quantized): what the engine does with LoRA there
        (:mod:`adapterdoc.engines.quantized`). The default: nothing."""
        return []

    def label(self, options: ProfileOptions) -> str:
        """The profile as the text report's header names it."""
        return self.name

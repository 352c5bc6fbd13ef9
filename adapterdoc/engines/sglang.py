"""The SGLang profile (``verify --profile sglang``): SGLang's adapter rules as its own source states them,
AD420-AD438.

Every rule here describes :data:`SGLANG_VERSION` (``python/sglang/srt/lora/`` ``lora_config.py``, ``lora.py``,
``lora_manager.py``, ``mem_pool.py``, ``utils.py``; ``srt/arg_groups/fields/lora.py`` for the server options);
the messages say so. The explanations are in :mod:`adapterdoc.codes.sglang`. What SGLang does with the tensor
names is ported in :mod:`.sglang_keys`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar

from adapterdoc.engines.base import (
    CopyCheck,
    EngineNeeds,
    Profile,
    ProfileInput,
    ProfileOptions,
    engine_finding,
)
from adapterdoc.engines.options import LORA_TARGET_MODULES, MAX_LORA_RANK
from adapterdoc.engines.sglang_copies import base_config, compare, copy_keys
from adapterdoc.engines.sglang_keys import (
    EMBEDDING_NAMES,
    KNOWN_TARGETS,
    LAYER_ID,
    SERVER_CHOICES,
    Loaded,
    RegexTargets,
    load,
    missing_partners,
    normalize_targets,
    target_of,
)

if TYPE_CHECKING:
    from adapterdoc.adapter import AdapterConfig, LoraKey
    from adapterdoc.engines.zero_lora import FillInput, ZeroLora
    from adapterdoc.ml.meta import ExpectedModel
    from adapterdoc.quant import Quantization, QuantizedModule
    from adapterdoc.report.findings import Finding
    from adapterdoc.report.verify_report import VerifySubject

SGLANG_VERSION = "0.5.23"
"""The SGLang release (PyPI ``sglang==0.5.23``; its ``_version.py`` records no commit) these rules were read from."""

REFUSED = "SGLang refuses the adapter when it loads"
FIRST_REQUEST = "SGLang starts, then the first request that uses the adapter fails"
SILENT = "SGLang serves other outputs than PEFT, with no error"

CONSEQUENCE = {
    "AD420": "wrong-output",
    "AD421": "refused",
    "AD422": "refused",
    "AD423": "refused",
    "AD424": "first-request",
    "AD425": "refused",
    "AD426": "wrong-output",
    "AD427": "first-request",
    "AD428": "wrong-output",
    "AD429": "wrong-output",
    "AD430": "first-request",
    "AD431": "refused",
    "AD432": "wrong-output",
    "AD433": "first-request",
    "AD434": "wrong-output",
    "AD435": "refused",
    "AD436": "refused",
    "AD438": "wrong-output",
    "AD490": "wrong-output",
    "AD493": "first-request",
    "AD494": "wrong-output",
}
"""What SGLang does with an adapter that has each error: ``refused`` (the load fails: a startup ``--lora-paths``
adapter stops the server, ``/load_lora_adapter`` answers an error), ``first-request`` (it loads and the server
starts; the first request that uses it fails, when its weights are copied into the memory pool) or
``wrong-output`` (served, with other outputs than PEFT's). The oracle tests hold SGLang's own code to it."""

ORDER = ("refused", "first-request", "wrong-output")


def verdict(codes: Iterable[str]) -> str:
    """The worst consequence among error ``codes`` (``accept`` when none has one)."""
    found = {CONSEQUENCE[c] for c in codes if c in CONSEQUENCE}
    return next((v for v in ORDER if v in found), "accept")


class SglangProfile(Profile):
    name = "sglang"
    summary = "SGLang serving"
    options = ("max_lora_rank", "lora_target_modules")
    option_defaults: ClassVar[Mapping[str, object]] = {"max_lora_rank": None}
    """SGLang has no fixed ceiling: without ``--max-lora-rank`` the pool sizes itself from the startup adapters."""
    option_help: ClassVar[Mapping[str, str]] = {
        "max_lora_rank": "SGLang any rank (default: none, no rank check)"
    }

    def check_options(self, options: ProfileOptions) -> None:
        targets = LORA_TARGET_MODULES.of(options)
        if targets is None:
            return
        bad = [t for t in targets if t not in (*SERVER_CHOICES, "all")]
        if bad or not targets:
            raise ValueError(
                f"lora_target_modules must be from {', '.join(SERVER_CHOICES)} or all (SGLang {SGLANG_VERSION}), "
                f"got {', '.join(bad) or 'nothing'}"
            )
        if "all" in targets and len(targets) > 1:
            raise ValueError("lora_target_modules: all must be the only module given (SGLang's own rule)")

    def run_fields(self, options: ProfileOptions, *, active: bool) -> dict[str, object]:
        return {
            "max_lora_rank": MAX_LORA_RANK.of(options) if active else None,
            "sglang_version": SGLANG_VERSION if active else None,
            "lora_target_modules": list(LORA_TARGET_MODULES.of(options) or []) or None if active else None,
        }

    def label(self, options: ProfileOptions) -> str:
        rank = MAX_LORA_RANK.of(options) or "from the adapters"
        targets = " ".join(LORA_TARGET_MODULES.of(options) or ()) or "from the adapters"
        return f"sglang {SGLANG_VERSION}, max LoRA rank {rank}, target modules {targets}"

    def unservable(
        self, config: Mapping[str, object], modules: list[str], model_type: str | None
    ) -> str | None:
        tm = config.get("target_modules")
        try:
            targets = normalize_targets(tm) if isinstance(tm, (str, list)) else set()
        except (RegexTargets, TypeError):
            return None  # a regex is listed by remap --for; the list is then checked on verify
        odd = sorted(targets - KNOWN_TARGETS - {"all"})
        if odd:
            return f"SGLang {SGLANG_VERSION} has no LoRA support for target modules {odd}"
        return None

    def needs(self, base_layout: str | None, options: ProfileOptions | None = None) -> EngineNeeds:
        return EngineNeeds(
            keys="as-is",
            experts="per-expert",
            expert_lora=True,
            rslora=False,
            patterns=False,
            regex_targets=False,
            dora=False,
            modules_to_save=False,
            embedding_copies=True,
            lora_bias=False,
            version=SGLANG_VERSION,
            fill="sglang-pairs",
        )

    def zero_lora(self, a: FillInput) -> ZeroLora | None:
        """The partners SGLang stacks and the adapter lacks (:func:`~.sglang_keys.missing_partners`); their shapes
        come from the base."""
        from adapterdoc.engines.zero_lora import ZeroLora

        return ZeroLora(missing_partners(a.factors))

    def skipped_copies(self, keys: list[LoraKey], adapter_root: str, base: str | None) -> list[CopyCheck]:
        """PEFT's ``base_layer.weight`` copies beside LoRA on embed_tokens / lm_head, which SGLang skips (it serves
        the base's own weight), compared with the base's (:func:`~.sglang_copies.compare`)."""
        from adapterdoc.bases import resolve_base

        found = copy_keys(keys)
        if not found:
            return []
        spec = resolve_base(base) if base else None
        return compare(found, adapter_root, spec, base_config(spec))

    def rules(self, a: ProfileInput) -> list[Finding]:
        spec, report, keys, meta, options, config = a.spec, a.subject, a.keys, a.meta, a.options, a.config
        out, adapter_targets = _config_findings(
            spec, config, bool(report.config.get("inferred")), keys, options
        )
        server = _server_targets(options, adapter_targets, meta)
        out.append(
            _make(
                "AD437",
                spec,
                f"server targets {sorted(server)} "
                + (
                    "(--lora-target-modules)"
                    if LORA_TARGET_MODULES.of(options)
                    else "(inferred from the adapter)"
                )
                + (
                    f", --max-lora-rank {MAX_LORA_RANK.of(options)}"
                    if MAX_LORA_RANK.of(options)
                    else ", no --max-lora-rank"
                ),
            )
        )
        if adapter_targets is not None and LORA_TARGET_MODULES.of(options) and "all" not in server:
            extra = sorted(adapter_targets - server - {"all"})
            if extra:
                out.append(
                    _make(
                        "AD425",
                        spec,
                        f"target modules {extra} are not included in --lora-target-modules {sorted(server)}",
                        key="target_modules",
                    )
                )
        out += _key_findings(spec, config, keys, adapter_targets or set(), server)
        out += _added_tokens(spec, report, meta)
        out += _copies(spec, report, keys, meta)
        return out

    def quantized_base(
        self, spec: str, q: Quantization, quantized: Sequence[QuantizedModule]
    ) -> list[Finding]:
        from adapterdoc.engines.quantized import sglang_findings

        return sglang_findings(spec, q, quantized, SGLANG_VERSION)


PROFILE = SglangProfile()


def _config_findings(
    spec: str, acfg: AdapterConfig, inferred: bool, keys: list[LoraKey], options: ProfileOptions
) -> tuple[list[Finding], set[str] | None]:
    """The config rules (AD420-AD424, AD426, AD433-AD436, AD438) and the adapter's normalised targets."""
    raw = acfg.raw
    out: list[Finding] = []

    def add(code: str, msg: str, *, key: str | None = None, hint: str | None = None) -> None:
        out.append(_make(code, spec, msg, key=key, hint=hint))

    if inferred:
        add("AD422", "no adapter_config.json: LoRAConfig reads adapter_config.json and fails without it")
    else:
        missing = [f for f in ("peft_type", "r", "lora_alpha", "target_modules") if f not in raw]
        peft_type = raw.get("peft_type")
        if missing:
            add("AD422", "missing configuration fields: " + ", ".join(missing))
        elif not isinstance(peft_type, str) or peft_type.lower() != "lora":
            add("AD422", f"peft_type {peft_type!r} is not LORA (LoRAAdapter asserts it)", key="peft_type")
    r, alpha = raw.get("r", 8), raw.get("lora_alpha", 8)
    rank_ok = isinstance(r, int) and not isinstance(r, bool) and r > 0
    if not rank_ok:
        add("AD422", f"r {r!r} is not a positive integer", key="r")
    if raw.get("use_rslora") and rank_ok and isinstance(alpha, (int, float)):
        add(
            "AD420",
            f"use_rslora is ignored: served scaling lora_alpha / r = {alpha / r:g} instead of PEFT's "
            f"lora_alpha / sqrt(r) = {alpha / math.sqrt(r):g} ({math.sqrt(r):g}x too weak)",
            key="use_rslora",
            hint=f"adapterdoc remap {spec} --for sglang --out DIR",
        )
    if acfg.use_dora or any(k.role == "magnitude" for k in keys):
        add("AD421", "LoRA serving does not support DoRA adapters (use_dora / lora_magnitude_vector)")
    targets: set[str] | None = None
    tm = raw.get("target_modules")
    try:
        if isinstance(tm, str) or (isinstance(tm, list) and all(isinstance(t, str) for t in tm)):
            targets = normalize_targets(tm)
        elif "target_modules" in raw:
            add("AD423", f"target_modules {tm!r} is not a list of module names", key="target_modules")
    except RegexTargets:
        add(
            "AD423",
            f"target_modules {tm!r} is a regex; only a list or 'all' / 'all-linear' is accepted",
            key="target_modules",
            hint=f"adapterdoc remap {spec} --for sglang --out DIR",
        )
    if targets:
        odd = sorted(targets - KNOWN_TARGETS - {"all"})
        if odd:
            add("AD436", f"target modules {odd} have no LoRA support in SGLang", key="target_modules")
    if MAX_LORA_RANK.of(options) is not None and rank_ok and r > MAX_LORA_RANK.of(options):
        add(
            "AD424",
            f"LoRA rank {r} is greater than --max-lora-rank {MAX_LORA_RANK.of(options)}: as a startup --lora-paths "
            f"adapter, {FIRST_REQUEST} (LoRA buffer shape assertion); /load_lora_adapter refuses it",
            key="r",
            hint=f"start the server with --max-lora-rank {r} and verify with the same value",
        )
    for fld, own, code, what in (
        (
            "rank_pattern",
            r,
            "AD433",
            f"differs from r {r}; only r is read, so those weights do not fit the buffer slices: {FIRST_REQUEST} "
            "(LoRA buffer shape assertion)",
        ),
        ("alpha_pattern", alpha, "AD434", f"is ignored; those modules are served with lora_alpha {alpha}"),
    ):
        entries = {m: v for m, v in (raw.get(fld) or {}).items() if v != own}
        if entries:
            add(
                code,
                f"{fld} {entries} {what}",
                key=fld,
                hint=f"adapterdoc remap {spec} --for sglang --out DIR",
            )
    invocation = raw.get("alora_invocation_tokens")
    if invocation:
        add(
            "AD494",
            f"alora_invocation_tokens {invocation} (activated LoRA) is not read: SGLang applies the LoRA to every "
            f"token, PEFT only from the invocation tokens on: {SILENT}",
            key="alora_invocation_tokens",
        )
    mts = raw.get("modules_to_save")
    copies = {k.key for k in copy_keys(keys)}
    saved = [k for k in keys if k.role == "full" and k.key not in copies]
    in_layers = [k.key for k in saved if LAYER_ID.search(k.key)]
    if in_layers:
        add(
            "AD493",
            f"{len(in_layers)} whole tensor(s) of modules_to_save {mts or []} sit in the decoder layers, where "
            f"every weight must match a LoRA target: {FIRST_REQUEST} (ValueError: Cannot find target module name)",
            key=in_layers[0],
        )
    outside = [k.key for k in saved if not LAYER_ID.search(k.key)]
    if outside or (mts and not in_layers):
        add(
            "AD426",
            f"modules_to_save {mts or []} ({len(outside)} tensor(s) outside the decoder layers) are skipped with "
            f"at most a debug log: {SILENT}",
            key="modules_to_save" if mts else outside[0],
        )
    biases = [k.key for k in keys if k.role == "lora_B.bias"]
    if raw.get("lora_bias") or biases:
        add(
            "AD438",
            f"lora_bias: {len(biases)} lora_B.bias tensor(s) go into their module's lora_B slot and the lora_B "
            f"weight then overwrites them, so the biases are dropped: {SILENT} (the output is off by the bias)",
            key=biases[0] if biases else "lora_bias",
        )
    return out, targets


def _server_targets(
    options: ProfileOptions, adapter_targets: set[str] | None, meta: ExpectedModel
) -> set[str]:
    """The server's target modules: ``--lora-target-modules`` normalised (``all``: what ``auto_detect`` finds on
    the base, plus the embeddings), else the adapter's own, as SGLang infers them from a startup adapter."""
    given = LORA_TARGET_MODULES.of(options)
    if given and "all" not in given:
        return normalize_targets(given)
    if given or (adapter_targets and "all" in adapter_targets):
        return _auto_detect(meta) | (set(EMBEDDING_NAMES) if given else set())
    return set(adapter_targets or ())


def _auto_detect(meta: ExpectedModel) -> set[str]:
    """``auto_detect_lora_target_modules`` from the base's module names: the leaves SGLang knows, and both expert
    projections where the base has routed experts."""
    from adapterdoc.adapter.expert_picture import is_shared_expert

    names = list(meta.base_modules)
    found = normalize_targets({n.rpartition(".")[2] for n in names}) & KNOWN_TARGETS
    if any(n.endswith(".experts") and not is_shared_expert(n) for n in names):
        found |= {"gate_up_proj", "down_proj"}
    return found


def _key_findings(
    spec: str, acfg: AdapterConfig, keys: list[LoraKey], adapter_targets: set[str], server: set[str]
) -> list[Finding]:
    """Where SGLang puts each tensor and what it then applies (AD427-AD430, AD432, AD435)."""
    from adapterdoc.adapter.expert_picture import expert_picture
    from adapterdoc.layouts import tower_segment

    out: list[Finding] = []

    def add(code: str, msg: str, names: Sequence[str], *, hint: str | None = None) -> None:
        out.append(_make(code, spec, msg, key=names[0], hint=hint))

    role = {k.key: k for k in keys}
    towers = sorted({k.key for k in keys if k.is_lora and tower_segment(k.module)})
    if towers:
        add("AD432", f"{len(towers)} LoRA tensor(s) outside the language model are not applied", towers)
    pic = expert_picture({k.key: () for k in keys}, config=acfg)
    fused = sorted({ek.key for b in pic.routed if b.layout == "fused" for ek in b.keys})
    if fused:
        add(
            "AD430",
            f"{len(fused)} fused expert tensor(s) (target_parameters) name no projection, so they match no LoRA "
            f"target: {FIRST_REQUEST} (ValueError: Cannot find target module name)",
            fused,
            hint=f"adapterdoc remap {spec} --for sglang --out DIR",
        )
    skip = set(towers) | set(fused)
    loaded: Loaded = load([k.key for k in keys if k.key not in skip], adapter_targets)
    if loaded.qkv_key_error:
        add(
            "AD435",
            "q_proj LoRA without v_proj in the same layer: normalize_qkv_proj fails",
            loaded.qkv_key_error,
            hint=f"adapterdoc remap {spec} --for sglang --out DIR",
        )
    unmatched = sorted(
        k
        for names in loaded.layers.values()
        for new, olds in names.items()
        if not target_of(new, server)
        for k in olds
        if k not in loaded.qkv_key_error and role[k].is_lora
    ) + sorted(
        k
        for k in loaded.embedding
        if role[k].is_lora and not target_of(k.replace("unembed_tokens", "lm_head"), server)
    )
    if unmatched:
        add(
            "AD427",
            f"{len(unmatched)} LoRA weight(s) match no target module in {sorted(server)} after SGLang's renames: "
            f"{FIRST_REQUEST} (ValueError: Cannot find target module name)",
            unmatched,
        )
    outside = sorted(loaded.dropped + loaded.untargeted_embedding)
    outside = [k for k in outside if role[k].role not in ("full", "magnitude")]
    if outside:
        add("AD428", f"{len(outside)} tensor(s) outside the decoder layers are dropped", outside)
    per_expert = [b for b in pic.routed if b.layout != "fused"]
    lacking = [t for t in ("gate_up_proj", "down_proj") if t not in server]
    if per_expert and lacking:
        add(
            "AD429",
            f"{len(per_expert)} MoE block(s) carry expert LoRA but the server targets lack {lacking}: "
            "the fused-MoE layer gets no LoRA",
            [per_expert[0].keys[0].key] if per_expert[0].keys else [per_expert[0].path],
        )
    return out


def _added_tokens(spec: str, report: VerifySubject, meta: ExpectedModel) -> list[Finding]:
    """AD431: ``added_tokens.json`` ids at or above the base's vocabulary (``LoRAConfig`` filters the others)."""
    root = report.path if report.path and os.path.isdir(report.path) else None
    path = os.path.join(root, "added_tokens.json") if root else None
    if not path or not os.path.isfile(path):
        return []
    try:
        with open(path, encoding="utf-8") as f:
            tokens = json.load(f)
    except (OSError, ValueError):
        return []  # SGLang logs a warning and reads no added tokens
    vocab = _vocab_size(meta)
    if not isinstance(tokens, dict) or vocab is None:
        return []
    added = {t: i for t, i in tokens.items() if isinstance(i, int) and i >= vocab}
    if not added:
        return []
    return [
        _make(
            "AD431",
            spec,
            f"{len(added)} added token(s) with ids >= the base vocabulary {vocab}, e.g. {next(iter(added))!r}",
            key="added_tokens.json",
        )
    ]


def _copies(spec: str, report: VerifySubject, keys: list[LoraKey], meta: ExpectedModel) -> list[Finding]:
    """AD490 / AD491: PEFT's ``base_layer.weight`` copy of a LoRA-targeted embed_tokens / lm_head, which SGLang
    skips (it serves the base's weight): an error only where the copy differs from the base's."""
    out = []
    for c in compare(keys, report.path, meta.base, _base_raw(meta)):
        what = f"`{c.key}` ({c.head}.base_layer.weight, PEFT's saved copy of the base weight): {c.detail}"
        if c.verdict in ("differs", "shape"):
            out.append(
                _make(
                    "AD490",
                    spec,
                    f"{what}; it differs from the base's and SGLang skips it, serving the base's own {c.head}: "
                    f"{SILENT}",
                    key=c.key,
                )
            )
        else:
            note = "it equals the base's" if c.verdict == "equal" else "not compared"
            out.append(
                _make(
                    "AD491",
                    spec,
                    f"{what}; {note}: SGLang skips the copy and applies the LoRA on {c.head}",
                    key=c.key,
                )
            )
    return out


def _base_raw(meta: ExpectedModel) -> Mapping[str, object] | None:
    """The base's config as plain data (:func:`~adapterdoc.engines.sglang_copies.base_config`)."""
    return base_config(meta.base)


def _vocab_size(meta: ExpectedModel) -> int | None:
    """The base's text ``vocab_size`` (SGLang reads ``get_text_config().vocab_size``)."""
    return _find_vocab(_base_raw(meta))


def _find_vocab(raw: object) -> int | None:
    if not isinstance(raw, dict):
        return None
    vocab = raw.get("vocab_size")
    if isinstance(vocab, int):
        return vocab
    for value in raw.values():
        found = _find_vocab(value)
        if found is not None:
            return found
    return None


def _make(code: str, spec: str, msg: str, *, key: str | None = None, hint: str | None = None) -> Finding:
    return engine_finding(f"SGLang {SGLANG_VERSION}", code, spec, msg, key=key, hint=hint)

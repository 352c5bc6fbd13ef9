"""`adapterdoc verify`: the pre-deploy gate. Does an adapter load, fully and meaningfully, on this base (and server)?

Per adapter: its header (inspect's checks), its keys against what PEFT builds on the base (:mod:`.base`,
:mod:`.keys`), config checks (:mod:`.config`), the weight scans (:mod:`.weights`), the chosen profile's rules
(:mod:`.profiles`) and an optional real PEFT load (:mod:`.load`). Torch is imported only inside the functions that
need it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from adapterdoc.adapter import parse_key
from adapterdoc.checkpoint import Checkpoint, open_checkpoint
from adapterdoc.errors import AdapterdocError, ConfigError, MissingExtraError, UnsupportedInputError
from adapterdoc.facts import header_facts
from adapterdoc.layouts import Detection
from adapterdoc.ml.meta import ExpectedModel
from adapterdoc.report.findings import Finding, make, sort_findings
from adapterdoc.report.verify_report import OWN_BASE, VerifyReport, VerifyRun, VerifySubject, build_report
from adapterdoc.verify.base import Base, built_as_finding, expected_model, keys_view
from adapterdoc.verify.common import at, dedupe
from adapterdoc.verify.config import adapter_config, check_config
from adapterdoc.verify.keys import check_keys
from adapterdoc.verify.load import check_load
from adapterdoc.verify.options import VerifyOptions
from adapterdoc.verify.quant import check_quantization
from adapterdoc.verify.weights import check_weights


def verify(adapters: Iterable[str], base: str, options: VerifyOptions | None = None) -> VerifyRun:
    """Verify each adapter against ``base``; an unusable base raises, an unusable adapter is reported.

    Expected keys come from the registry's module tree and PEFT's rules (:mod:`adapterdoc.verify.expected`, no torch)
    when the registry describes the base config and the adapter config exactly, else from PEFT on the meta
    device; each report says which (``expected_keys_from``)."""
    from adapterdoc.ml import meta as M

    options = options or VerifyOptions()
    try:
        b = Base.resolve(base)
    except AdapterdocError:
        # a base only another format reads (a GGUF model file): fine when every adapter's format checks itself
        run = _foreign_run(list(adapters), base, options)
        if run is None:
            raise
        return run
    spec = b.spec
    if options.load:
        M.require_ml("--load")
    info = {"kind": spec.kind, "has_weights": spec.has_weights, "model_type": b.model_type}
    if options.load and not spec.has_weights:
        raise MissingWeightsError(base, "--load needs a base with weights (config.json alone is not enough)")
    reports: list[VerifyReport] = []
    for adapter in adapters:
        try:
            reports.append(verify_one(adapter, b, options))
        except MissingExtraError:
            raise
        except AdapterdocError as e:
            reports.append(VerifyReport(adapter=adapter, error=str(e)))
    layout = next((r.base_layout for r in reports if r.base_layout), None)
    if layout:
        info["layout"] = layout
    return VerifyRun(base=base, options=options, adapters=reports, base_info=info)


def verify_own_bases(adapters: Iterable[str], options: VerifyOptions | None = None) -> VerifyRun:
    """Verify each adapter against the base its ``adapter_config.json`` names (``base_model_name_or_path``: a
    model folder, a cached repo id or ``tiny:LAYOUT``); an adapter whose base does not resolve locally is
    reported as unusable (exit 3). Adapters that name the same base share one meta-device build."""
    options = options or VerifyOptions()
    order = list(adapters)
    groups: dict[str, list[str]] = {}
    reports: dict[str, VerifyReport] = {}
    for adapter in order:
        try:
            named = _named_base(adapter)
            if not named:
                raise ConfigError(
                    adapter,
                    "no --base given and the adapter names no base (adapter_config.json's "
                    "base_model_name_or_path; an MLX adapter's `model`): pass --base",
                )
        except AdapterdocError as e:
            reports[adapter] = _refused_alone(adapter, e) or VerifyReport(adapter=adapter, error=str(e))
            continue
        groups.setdefault(named, []).append(adapter)
    for named, members in groups.items():
        try:
            run = verify(members, named, options)
        except MissingExtraError:
            raise
        except AdapterdocError as e:
            for adapter in members:
                reports[adapter] = VerifyReport(adapter=adapter, error=f"its base {named!r}: {e}")
            continue
        for rep in run.adapters:
            reports[rep.adapter] = rep
    return VerifyRun(base=OWN_BASE, options=options, adapters=[reports[a] for a in order])


def _refused_alone(adapter: str, error: AdapterdocError) -> VerifyReport | None:
    """For an MLX or GGUF adapter whose base could not be read off it (``error``): the verdict of its format's
    container rules when they already fail it, as ``inspect`` gives it (:func:`~adapterdoc.verify.formats.
    container_verdict`); else ``None``."""
    from adapterdoc.formats.foreign import foreign
    from adapterdoc.verify.formats import container_verdict

    other = foreign(adapter)
    if other is None:
        return None
    try:
        rules = list(other[1].check(Path(os.path.expanduser(adapter)), None))
    except AdapterdocError:
        return None
    return container_verdict(adapter, other[0], rules, error)


def _named_base(adapter: str) -> str | None:
    """The base ``adapter``'s config names (``base_model_name_or_path``), read from its PEFT view when it is in
    another format (an MLX folder's ``model``, the PEFT config a GGUF written by adapterdoc carries)."""
    from adapterdoc.formats.foreign import foreign, peft_view

    other = foreign(adapter)
    if other is None:
        cfg = open_checkpoint(adapter).adapter_config
        return cfg.base_model if cfg else None
    with peft_view(Path(os.path.expanduser(adapter)), other[1], None) as view:
        cfg = open_checkpoint(os.fspath(view)).adapter_config
        return cfg.base_model if cfg else None


def _foreign_run(adapters: list[str], base: str, options: VerifyOptions) -> VerifyRun | None:
    """The run against a GGUF model file (a base only llama.cpp reads), else ``None``: each GGUF adapter is
    verified against it; any other adapter is unusable against such a base, with the reason (its own unreadable
    file, or that a PEFT or MLX adapter is checked against the Hugging Face model). ``--load`` and a serving
    profile need the Hugging Face model, so they are refused here (exit 3)."""
    from adapterdoc.formats import SCREENS
    from adapterdoc.formats.foreign import foreign
    from adapterdoc.verify.formats import verify_foreign

    if not SCREENS["gguf"](Path(os.path.expanduser(base))):
        return None
    if options.load or options.profile_rules.name != "peft":
        what = "--load" if options.load else f"--profile {options.profile_rules.name}"
        raise UnsupportedInputError(
            base,
            f"is a GGUF model (llama.cpp's); {what} needs the Hugging Face model (its folder or config.json)",
        )
    reports = []
    for adapter in adapters:
        found = foreign(adapter)
        if found is not None and found[0].format == "gguf":
            reports.append(verify_foreign(adapter, *found, base, options, verify_one, verify_static))
            continue
        try:
            if found is None:
                open_checkpoint(adapter)  # its own reason first: a file that is no adapter at all
            why = f"{adapter}: is not a GGUF adapter: verify it against the Hugging Face model (folder or config.json)"
        except AdapterdocError as e:
            why = str(e)
        reports.append(VerifyReport(adapter=adapter, error=why))
    return VerifyRun(base=base, options=options, adapters=reports, base_info={"kind": "file"})


class MissingWeightsError(AdapterdocError):
    """``--load`` on a base that has only a config."""


def verify_one(spec: str, base: Base, options: VerifyOptions) -> VerifyReport:
    """Verify one adapter (``base`` is a resolved :class:`Base`): each check returns its result, and the report is
    built from them once, at the end."""
    from adapterdoc.formats.foreign import foreign
    from adapterdoc.verify.peft_layout import check_peft_layout

    other = foreign(spec)
    if other is not None:  # an MLX or GGUF adapter: this doctor on its PEFT view, plus its format's own rules
        from adapterdoc.verify.formats import verify_foreign

        return verify_foreign(spec, *other, base, options, verify_one, verify_static)
    from adapterdoc.formats.foreign import refuse_model_gguf

    refuse_model_gguf(spec)
    ckpt = open_checkpoint(spec)
    layout, dtypes, header = _header(ckpt, spec)
    keys = [parse_key(k) for k in ckpt.tensors]

    acfg, inferred = adapter_config(ckpt, keys)
    shapes = {k: tuple(t.shape) for k, t in ckpt.tensors.items()}
    expected = expected_model(base, acfg, shapes, ckpt.root or spec, options.expected_keys == "auto")
    meta = expected.model
    kmeta = _keys_view(spec, meta, options)
    km = kmeta.match(shapes)
    config = check_config(spec, acfg, meta, keys, inferred)
    subject = VerifySubject(
        adapter=spec,
        path=ckpt.root,
        layout=layout.name,
        layout_candidates=tuple(layout.candidates),
        config=config.summary,
        keys_against=kmeta.keys_against,
    )
    key_check = check_keys(subject, ckpt, keys, kmeta, km, acfg)
    weights = check_weights(spec, ckpt, keys, options.scan, options.max_inert_share)
    profile = options.profile_rules.check(subject, keys, kmeta, options, acfg)
    flagged = {k for k, _, _ in km.shape_mismatch}
    quantized = check_quantization(spec, base.quantization(), keys, shapes, options.profile_rules, flagged)
    load = check_load(spec, ckpt, base.spec, meta.built_as) if options.load else None
    if (
        meta.layout is None
    ):  # a base outside the registry: which registry layout the keys resemble says nothing
        header = [f for f in header if f.code != "AD209"]
    findings = [
        *header,
        *_inferred(spec, inferred),
        *([built_as_finding(spec, meta.built_as)] if meta.built_as is not None else []),
        *key_check.findings,
        *config.findings,
        *check_peft_layout(spec, acfg, shapes, meta),
        *weights.findings,
        *profile.findings,
        *quantized,
        *(load.findings if load else ()),
    ]
    return build_report(
        subject,
        sort_findings(dedupe(findings)),
        base_layout=meta.layout,
        expected_keys_from=expected.source,
        expected_keys_note=expected.note,
        missing=km.missing,
        unexpected=km.unexpected,
        shape_mismatch=[k for k, _, _ in km.shape_mismatch],
        shape_details=[{"key": k, "adapter": list(a), "expected": list(e)} for k, a, e in km.shape_mismatch],
        lora_b=dict(weights.lora_b),
        nonfinite=dict(weights.nonfinite),
        dtypes=dtypes,
        move=None if key_check.move is None else dict(key_check.move),
        served_as=profile.served_as,
        load=None if load is None else dict(load.load),
        weights=None if weights.weights is None else dict(weights.weights),
    )


STATIC = "none"
"""``expected_keys_from`` of a report with no base model to build keys from (a GGUF adapter against a GGUF model,
whose container rules compare the keys by llama.cpp's names)."""


def verify_static(spec: str, options: VerifyOptions) -> VerifyReport:
    """The checks that need no base model, on the PEFT adapter ``spec``: its header's findings, the config it was
    inferred from, and the weight scans (``lora_B``, NaN/Inf, the inert share). For an adapter whose base only its
    own format reads (a GGUF adapter against a GGUF model, whose container rules compare the keys)."""
    ckpt = open_checkpoint(spec)
    layout, dtypes, header = _header(ckpt, spec)
    header = [
        f for f in header if f.code != "AD209"
    ]  # no registry layout to be ambiguous about: no base model
    keys = [parse_key(k) for k in ckpt.tensors]
    _, inferred = adapter_config(ckpt, keys)
    weights = check_weights(spec, ckpt, keys, options.scan, options.max_inert_share)
    findings = [
        *header,
        *_inferred(spec, inferred),
        *weights.findings,
    ]
    subject = VerifySubject(
        adapter=spec,
        path=ckpt.root,
        layout=layout.name,
        layout_candidates=tuple(layout.candidates),
        config={},
        keys_against=None,
    )
    return build_report(
        subject,
        sort_findings(dedupe(findings)),
        expected_keys_from=STATIC,
        lora_b=dict(weights.lora_b),
        nonfinite=dict(weights.nonfinite),
        dtypes=dtypes,
        weights=None if weights.weights is None else dict(weights.weights),
    )


def _inferred(spec: str, inferred: bool) -> list[Finding]:
    """AD231 when the adapter had no adapter_config.json (its targets and ranks were read off the tensors)."""
    if not inferred:
        return []
    return [make("AD231", "no adapter_config.json: targets and ranks inferred from the tensors", path=spec)]


def _keys_view(spec: str, meta: ExpectedModel, options: VerifyOptions) -> ExpectedModel:
    """The expected model as the profile's engine names its keys (:meth:`Profile.keys_against`), with the
    ``remap --for`` fix for keys that are not so named; ``meta`` itself when the profile checks PEFT's own."""
    profile = options.profile_rules
    view = profile.keys_against(meta.layout, options)
    if view is None:
        return meta
    needs = profile.needs(meta.layout, options)
    fix = f"adapterdoc remap {spec} --for {profile.name} --out DIR" if needs else None
    return keys_view(meta, view, fix)


def _header(ckpt: Checkpoint, spec: str) -> tuple[Detection, dict[str, int], list[Finding]]:
    """What the header alone says (:func:`adapterdoc.facts.header_facts`): the detected layout, the dtypes and its
    findings under ``spec``, less AD205 (the key findings say more: AD221, AD224)."""
    facts = header_facts(ckpt)
    return facts.layout, dict(facts.dtypes), [at(f, spec) for f in facts.findings if f.code != "AD205"]

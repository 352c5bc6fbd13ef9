"""The base an adapter is verified against, and the model PEFT would build on it: the registry's module tree and
PEFT's rules where they describe it exactly (:mod:`adapterdoc.verify.expected`, torch-free), else PEFT on the meta
device (:mod:`adapterdoc.ml.meta`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from adapterdoc.adapter import AdapterConfig
from adapterdoc.errors import MissingExtraError
from adapterdoc.ml.meta import ExpectedModel, KeyMatch, Shapes
from adapterdoc.report.findings import Finding, make

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from adapterdoc.bases import BaseSpec
    from adapterdoc.layouts import Rule
    from adapterdoc.layouts.trees import Tree
    from adapterdoc.ml.build import BuiltAs
    from adapterdoc.quant import Quantization


class RegistryDeclined(MissingExtraError):
    """The registry cannot decide and the ML extra is not installed: the one line names the input at fault, and
    ``--json`` carries the reason as ``expected_keys_note``."""

    def __init__(self, e: MissingExtraError, note: str | None) -> None:
        super().__init__(e.what, "torch")
        self.reason, self.note = e.reason, note
        self.details = {"expected_keys_note": note} if note else {}
        self.args = (str(self),)


class Base:
    """The resolved base and the two ways to its expected keys: the registry's module tree (torch-free) when it
    describes the config exactly, else the transformers config for the meta-device model (loaded on first use)."""

    def __init__(
        self, spec: BaseSpec, tree: Tree | None, why: str | None, raw: Mapping[str, object] | None
    ) -> None:
        self.spec, self.tree, self.why, self.raw = spec, tree, why, raw
        self._config: PretrainedConfig | None = None
        self._quantization: Quantization | None = None

    @classmethod
    def resolve(cls, base: str) -> Base:
        from adapterdoc.bases import registry_view, resolve_base

        spec = resolve_base(base)
        return cls(spec, *registry_view(spec))

    def config(self, why: str | None = None, culprit: str | None = None) -> PretrainedConfig:
        """The transformers config (the meta-device path); exit 3 naming the ML extra when it is not installed,
        and the input the registry could not decide: ``culprit`` (the adapter config) or the base."""
        from adapterdoc.ml import meta as M

        if self._config is None:
            reason = why or self.why
            who = culprit or self.spec.spec
            what = who if not reason else f"{who} (the registry cannot decide: {reason})"
            try:
                self._config = M.load_config(self.spec, what)
            except MissingExtraError as e:
                raise RegistryDeclined(e, reason) from e
        return self._config

    def quantization(self) -> Quantization:
        """How the base is stored quantized (:func:`adapterdoc.quant.detect_base`: its config and its weights'
        headers, torch-free), read on first use; scheme ``none`` for a plain base."""
        if self._quantization is None:
            from adapterdoc.quant import detect_base

            self._quantization = detect_base(self.spec)
        return self._quantization

    @property
    def model_type(self) -> object:
        """The base config's ``model_type`` (as written: a string, or whatever else config.json holds)."""
        if self.raw is not None:
            return self.raw.get("model_type")
        return getattr(self.config(), "model_type", None)


def _auto_mapping_class(acfg: AdapterConfig) -> str | None:
    auto = acfg.raw.get("auto_mapping")
    cls = auto.get("base_model_class") if isinstance(auto, dict) else None
    return cls if isinstance(cls, str) else None


def built_as_finding(spec: str, b: BuiltAs) -> Finding:
    where = "the same config" if not b.config_path else f"the config's {'.'.join(b.config_path)}"
    return make(
        "AD115",
        f"base built as {b.model_class} (the adapter's auto_mapping.base_model_class, layout {b.layout}) from "
        f"{where}; its config's own class is {b.default_class}",
        path=spec,
        key="auto_mapping",
    )


@dataclass(frozen=True)
class Expected:
    """The expected model and where it came from: the report's ``expected_keys_from`` and ``expected_keys_note``."""

    model: ExpectedModel
    source: str
    """``registry`` or ``meta-device``."""
    note: str | None = None
    """Why the registry did not decide, when the meta-device path did."""


def expected_model(base: Base, acfg: AdapterConfig, shapes: Shapes, adapter: str, registry: bool) -> Expected:
    """The registry's expected keys when it can say exactly, else PEFT's own on the meta device (``adapter``: the
    adapter's folder or file, named when its keys are what the registry cannot judge).

    The class question is the registry's too: an adapter whose ``auto_mapping`` names a counterpart class the
    base can be built as (:func:`adapterdoc.layouts.loadable_as`) gets that class's tree, as the meta path builds
    it (:func:`adapterdoc.ml.build.counterpart_class`); any other class name leaves the base's own class."""
    from adapterdoc.layouts.trees import Unmodeled
    from adapterdoc.ml import meta as M
    from adapterdoc.verify.expected_config import AdapterUnmodeled, KeysUnmodeled, check_peft_type

    check_peft_type(acfg.raw, acfg.path)
    why = base.why if registry else "meta-device path requested"
    culprit = None
    as_class = _auto_mapping_class(acfg)
    if registry and base.tree is not None:
        from adapterdoc.verify.expected import registry_adapter

        try:
            tree, built_as = registry_class(base, as_class)
            meta = registry_adapter(tree, acfg, shapes, base=base.spec)
            return Expected(dataclasses.replace(meta, built_as=built_as), "registry")
        except Unmodeled as e:
            why = str(e)
            if isinstance(e, AdapterUnmodeled):
                culprit = acfg.path
            elif isinstance(e, KeysUnmodeled):
                culprit = adapter
    config = base.config(why, culprit)
    lora_cfg = M.lora_config_from_raw(acfg.raw, acfg.path)
    meta = M.build_meta_adapter(base.spec, lora_cfg, config=config, as_class=as_class)
    return Expected(meta, "meta-device", why)


def registry_class(base: Base, as_class: str | None) -> tuple[Tree, BuiltAs | None]:
    """(the tree, ``BuiltAs`` or ``None``): the base's own tree, or the counterpart class's that ``as_class`` names
    where the base's config holds the sub-config it is built from."""
    from adapterdoc.layouts import LAYOUTS, loadable_as
    from adapterdoc.layouts.trees import Unmodeled, build_tree
    from adapterdoc.ml.build import BuiltAs

    tree = base.tree
    assert tree is not None  # called for a base the registry describes
    if not as_class or as_class == tree.model_class:
        return tree, None
    homes = [
        n
        for n, lay in LAYOUTS.items()
        if lay.model_class == tree.model_class and lay.model_type == tree.model_type
    ]
    for home in homes:
        for name, attrs in loadable_as(home)[1:]:
            if LAYOUTS[name].model_class != as_class:
                continue
            sub: object = base.raw
            for attr in attrs:
                sub = sub.get(attr) if isinstance(sub, dict) else None
            if attrs and sub is None:
                raise Unmodeled(
                    f"the config has no `{'.'.join(attrs)}` to build {as_class} from (its default is not modelled)"
                )
            if not isinstance(sub, dict) or sub.get("model_type") is None:
                continue
            built = build_tree({**sub, "architectures": [as_class]})
            return built, BuiltAs(as_class, name, tree.model_class, home, attrs)
    return tree, None


@dataclass(frozen=True)
class ViewMatch:
    """The :class:`~adapterdoc.ml.meta.KeyMatcher` of an engine's view of the expected model (``inner``): an
    adapter's keys put through ``inner``'s own :meth:`~adapterdoc.ml.meta.ExpectedModel.match` (so PEFT's
    load-time rules still apply) with each engine-style key renamed back to the base's; a key that is not
    engine-style (a name the move would still change, or a tower module) is unexpected."""

    inner: ExpectedModel
    rules: tuple[Rule, ...]
    to_base: Mapping[str, str]
    """Engine-style expected key → the base's."""

    def _engine(self, key: str) -> str:
        from adapterdoc.layouts import apply_move

        return apply_move(self.rules, key)

    def match(self, model: ExpectedModel, shapes: Shapes) -> KeyMatch:
        fed: dict[str, tuple[int, ...]] = {}
        back: dict[str, str] = {}
        wrong: list[str] = []
        for key, shape in shapes.items():
            inner = self.to_base.get(key)
            if inner is None:
                if _tower(key) or self._engine(key) != key:
                    wrong.append(key)
                    continue
                inner = key
            fed[inner], back[inner] = shape, key
        km = self.inner.match(fed)
        return dataclasses.replace(
            km,
            missing=sorted({self._engine(k) for k in km.missing if not _tower(k)}),
            unexpected=sorted([back.get(k, k) for k in km.unexpected] + wrong),
            shape_mismatch=sorted((self._engine(k), got, want) for k, got, want in km.shape_mismatch),
        )


def _view(
    meta: ExpectedModel, rules: tuple[Rule, ...], layout: str | None, model_class: str, fix: str | None
) -> ExpectedModel:
    """``meta`` as an engine names its keys: module paths and expected keys renamed along ``rules`` (the registry
    move from the base's layout to its text counterpart, or the ``language_model`` strip of ``remap --vl`` when
    the registry has none), towers dropped; everything else as ``meta`` has it."""
    from adapterdoc.layouts import apply_move, rename

    own = [k for k in meta.expected if not _tower(k)]
    return dataclasses.replace(
        meta,
        base_modules=tuple(rename(rules, m) for m in meta.base_modules if not _tower(m)),
        expected={apply_move(rules, k): meta.expected[k] for k in own},
        matcher=ViewMatch(meta, rules, {apply_move(rules, k): k for k in own}),
        layout=layout,
        model_class=model_class,
        fix=fix,
        keys_against={"view": "text", "layout": layout, "model_class": model_class},
    )


def _tower(name: str) -> bool:
    from adapterdoc.layouts import tower_segment

    return tower_segment(name) is not None


def keys_view(meta: ExpectedModel, view: str | None, fix: str | None) -> ExpectedModel:
    """``meta`` as a profile's :meth:`~adapterdoc.engines.base.Profile.keys_against` asks its keys to be
    checked (``text``: the base's text model, named by the registry's text counterpart of its layout when it has
    one, else the base's language model with ``language_model.`` stripped); ``meta`` itself for ``None`` or a
    base with no such view."""
    from adapterdoc.engines.served import is_vl, served_layout
    from adapterdoc.layouts import LAYOUTS, VL_RULES, move_rules

    if view != "text" or meta.layout is None or not is_vl(meta.layout):
        return meta
    layout = served_layout(meta.layout, "text")
    rules = move_rules(meta.layout, layout) if layout else None
    if layout is None or rules is None:
        layout, rules = None, VL_RULES
        model_class = f"the language model of {meta.model_class} (text-style keys)"
    else:
        model_class = f"{LAYOUTS[layout].model_class} (layout {layout}, the text model)"
    return _view(meta, tuple(rules), layout, model_class, fix)

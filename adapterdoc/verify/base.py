"""The base an adapter is verified against, and the model PEFT would build on it: the registry's module tree and
PEFT's rules where they describe it exactly (:mod:`adapterdoc.verify.expected`, torch-free), else PEFT on the meta
device (:mod:`adapterdoc.ml.meta`)."""

from __future__ import annotations

from typing import Any

from adapterdoc.adapter import AdapterConfig
from adapterdoc.report.findings import Finding, make
from adapterdoc.report.verify_report import VerifyReport


class Base:
    """The resolved base and the two ways to its expected keys: the registry's module tree (torch-free) when it
    describes the config exactly, else the transformers config for the meta-device model (loaded on first use)."""

    def __init__(self, spec: Any, tree: Any, why: str | None, raw: dict[str, Any] | None) -> None:
        self.spec, self.tree, self.why, self.raw = spec, tree, why, raw
        self._config: Any = None

    @classmethod
    def resolve(cls, base: str) -> Base:
        from adapterdoc.bases import registry_view, resolve_base

        spec = resolve_base(base)
        return cls(spec, *registry_view(spec))

    def config(self, why: str | None = None) -> Any:
        """The transformers config (the meta-device path); exit 3 naming the ML extra when it is not installed."""
        from adapterdoc.ml import meta as M

        if self._config is None:
            reason = why or self.why
            what = (
                self.spec.spec if not reason else f"{self.spec.spec} (the registry cannot decide: {reason})"
            )
            self._config = M.load_config(self.spec, what)
        return self._config

    @property
    def model_type(self) -> Any:
        if self.raw is not None:
            return self.raw.get("model_type")
        return getattr(self.config(), "model_type", None)


def _auto_mapping_class(acfg: AdapterConfig) -> str | None:
    auto = acfg.raw.get("auto_mapping")
    cls = auto.get("base_model_class") if isinstance(auto, dict) else None
    return cls if isinstance(cls, str) else None


def built_as_finding(spec: str, b: Any) -> Finding:
    where = "the same config" if not b.config_path else f"the config's {'.'.join(b.config_path)}"
    return make(
        "AD115",
        f"base built as {b.model_class} (the adapter's auto_mapping.base_model_class, layout {b.layout}) from "
        f"{where}; its config's own class is {b.default_class}",
        path=spec,
        key="auto_mapping",
    )


def expected_model(
    base: Base, acfg: AdapterConfig, shapes: dict[str, tuple[int, ...]], report: VerifyReport, registry: bool
) -> Any:
    """The registry's expected keys when it can say exactly, else PEFT's own on the meta device."""
    from adapterdoc.layouts.trees import Unmodeled
    from adapterdoc.ml import meta as M

    why = base.why if registry else "meta-device path requested"
    as_class = _auto_mapping_class(acfg)
    if registry and base.tree is not None and as_class not in (None, base.tree.model_class):
        why = f"the adapter's auto_mapping names {as_class}, which the meta device builds from this config"
    elif registry and base.tree is not None:
        from adapterdoc.verify.expected import registry_adapter

        try:
            meta = registry_adapter(base.tree, acfg, shapes, base=base.spec)
            report.expected_keys_from = "registry"
            return meta
        except Unmodeled as e:
            why = str(e)
    config = base.config(why)
    lora_cfg = M.lora_config_from_raw(acfg.raw, acfg.path)
    report.expected_keys_from = "meta-device"
    report.expected_keys_note = why
    return M.build_meta_adapter(base.spec, lora_cfg, config=config, as_class=as_class)

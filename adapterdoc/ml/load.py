"""``verify --load``: really load base + adapter with PEFT and check the three post-load facts.

1. LoRA modules are present in the model; 2. ``load_adapter`` reports no missing and no unexpected LoRA keys;
3. the adapter changes the model's output on a fixed probe input. (1) alone is not enough, because PEFT injects
modules from the config before it loads any weight; (2) alone trusts PEFT's bookkeeping; (3) does not.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Protocol

from adapterdoc.errors import UnsupportedInputError
from adapterdoc.layouts import forward_module
from adapterdoc.ml.quiet import quiet_quantizers, quiet_transformers

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

    from adapterdoc.adapter import AdapterConfig
    from adapterdoc.bases import BaseSpec
    from adapterdoc.ml.build import BuiltAs
    from adapterdoc.ml.quant_load import QuantizedBase


class OpenedAdapter(Protocol):
    """What the load check reads of an opened adapter (``adapterdoc.opened.Checkpoint``, a layer above)."""

    root: str
    adapter_config: AdapterConfig | None


ADAPTER_NAME = "default"
"""The name PeftModel.from_pretrained uses, so keys saved with it (`lora_A.default.weight`) load as they do there."""
PROBE_TOKENS = (1, 17, 42, 99, 256, 511, 7, 3)
"""Token ids of the probe input (taken modulo the vocabulary size)."""


@dataclass(frozen=True)
class LoadResult:
    """What a real PEFT load of an adapter found: modules, missing and unexpected keys, the probe's output change."""

    lora_modules: int = 0
    missing: list[str] = field(default_factory=list)
    """LoRA keys PEFT created and the file did not fill (adapter name removed)."""
    unexpected: list[str] = field(default_factory=list)
    max_abs_diff: float | None = None
    """max |output(adapter) - output(base)| on the probe input."""
    probe: str = ""
    skipped: str | None = None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def load_check(base: BaseSpec, ckpt: OpenedAdapter, built_as: BuiltAs | None = None) -> LoadResult:
    """Load the base (``BaseSpec`` with weights) and the adapter ``ckpt`` and check the three facts; ``built_as``
    (:class:`~adapterdoc.ml.meta.BuiltAs`) loads the base as that counterpart class, as verify's key check did."""
    if ckpt.adapter_config is None:
        return LoadResult(skipped="PEFT needs adapter_config.json to load an adapter; this input has none")
    from adapterdoc.ml.quant_load import library_failure, quantized_base, require_libraries

    qb = quantized_base(base)
    if qb is None:
        return _load_check(base, ckpt, built_as, None)
    require_libraries(qb)
    try:
        with quiet_quantizers():
            return _load_check(base, ckpt, built_as, qb)
    except UnsupportedInputError:
        raise
    except Exception as e:  # whatever the quantization library raises is its limit on this base, not our bug
        raise library_failure(qb, e) from None


def _load_check(
    base: BaseSpec, ckpt: OpenedAdapter, built_as: BuiltAs | None, qb: QuantizedBase | None
) -> LoadResult:
    import torch
    from peft import LoraConfig, PeftModel

    quiet_transformers()
    model = load_base(base, built_as, qb)
    probe = probe_inputs(model)
    with torch.no_grad():
        before = forward(model, probe)
    cfg = LoraConfig.from_pretrained(ckpt.root)
    cfg.inference_mode = True
    # Zero lora_B before loading, whatever the saved config says (init_lora_weights=False would start from random
    # factors and PiSSA-style inits would rewrite the base): only weights that really load can move the output.
    cfg.init_lora_weights = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = PeftModel(model, cfg, adapter_name=ADAPTER_NAME)
        res = pm.load_adapter(ckpt.root, adapter_name=ADAPTER_NAME)
    pm.eval()
    lora = sum(1 for name, _ in pm.named_modules() if name.endswith(f"lora_A.{ADAPTER_NAME}"))
    lora += sum(1 for name, _ in pm.named_parameters() if name.endswith(f"lora_embedding_A.{ADAPTER_NAME}"))
    with torch.no_grad():
        after = forward(model, probe)
    diff = (
        float((after.float() - before.float()).abs().max()) if after.shape == before.shape else float("inf")
    )
    return LoadResult(
        lora_modules=lora,
        missing=sorted(_saved(k) for k in res.missing_keys if "lora_" in k),
        unexpected=sorted(k for k in res.unexpected_keys if "lora_" in k),
        max_abs_diff=diff,
        probe=f"{len(PROBE_TOKENS)} token ids {list(PROBE_TOKENS)} mod vocab, output {tuple(after.shape)}",
    )


def _saved(key: str) -> str:
    return key.replace(f".{ADAPTER_NAME}.", ".").removesuffix(f".{ADAPTER_NAME}")


def load_base(
    base: BaseSpec, built_as: BuiltAs | None = None, qb: QuantizedBase | None = None
) -> PreTrainedModel:
    """The base with its real weights, in eval mode, on the CPU; with ``built_as``, as that counterpart class
    (built from the sub-config, holding the base's weights renamed along the registry's move). A quantized base
    (``qb``, else detected here) loads dequantized where transformers can, after its library is checked."""
    model = _load_own(base, qb)
    if built_as is None:
        return model
    from adapterdoc.ml.build import counterpart_class
    from adapterdoc.ml.tiny import build_counterpart

    picked = counterpart_class(model.config, base, built_as.model_class)
    if picked is None:  # pragma: no cover - verify found it on the same config
        raise UnsupportedInputError(base.spec, f"cannot build {built_as.model_class} from this config")
    cls, sub, _ = picked
    import torch

    dst: PreTrainedModel = cls._from_config(sub, dtype=torch.float32)  # type: ignore[no-untyped-call]  # unannotated in transformers
    try:
        return build_counterpart(model, built_as.default_layout, built_as.layout, dst=dst)
    except RuntimeError as e:
        raise UnsupportedInputError(
            base.spec, f"cannot load the base as {built_as.model_class}: {e}"
        ) from None


def _load_own(base: BaseSpec, qb: QuantizedBase | None) -> PreTrainedModel:
    import torch

    if base.kind == "tiny":
        from adapterdoc.ml.tiny import build_tiny

        return build_tiny(base.tiny_layout, 0)  # type: ignore[arg-type]  # a tiny spec always names its layout
    from adapterdoc.ml.build import load_config, model_class_for
    from adapterdoc.ml.quant_load import loading_config, quantized_base, require_libraries

    qb = qb or quantized_base(base)
    if qb is not None:
        require_libraries(qb)
    qc = None if qb is None else loading_config(qb)  # None: as the checkpoint's config says
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    quiet_transformers()
    config = load_config(base)
    cls = model_class_for(config, base)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = cls.from_pretrained(
                base.root, config=config, dtype=torch.float32, local_files_only=True, quantization_config=qc
            )
    except Exception as e:
        if qb is not None:  # the quantization library's limit on this base
            from adapterdoc.ml.quant_load import library_failure

            raise library_failure(qb, e) from None
        if not isinstance(e, (OSError, ValueError, RuntimeError)):
            raise
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UnsupportedInputError(base.spec, f"cannot load the base weights: {reason}") from e
    model.eval()  # type: ignore[no-untyped-call]  # unannotated in transformers
    return model


def probe_inputs(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    import torch

    cfg = model.config
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    vocab = int(getattr(text, "vocab_size", 0) or getattr(cfg, "vocab_size", 1000))
    ids = torch.tensor([[t % vocab for t in PROBE_TOKENS]], dtype=torch.long)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def forward(model: PreTrainedModel, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    target = forward_module(model)  # a wrapper without a forward of its own runs through its inner model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = target(**inputs)
    for name in ("logits", "last_hidden_state"):
        value: torch.Tensor | None = getattr(out, name, None)
        if value is not None:
            return value
    first: torch.Tensor = out[0]
    return first

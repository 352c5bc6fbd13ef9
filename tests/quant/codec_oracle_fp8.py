"""Compare adapterdoc.quant.codec.fp8 bit for bit with transformers' FP8 ops and compressed-tensors (run in the
quant oracle environment by test_codec_fp8.py -m oracle).

    python codec_oracle_fp8.py ROOT

ROOT holds the bases fixtures/make_quantized.py made. Prints one JSON object: case → number of modules compared
bit-equal (every comparison that differs raises). Library surprises are asserts with a comment."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from adapterdoc.quant import detect_folder
from adapterdoc.quant.codec import fp8
from adapterdoc.quant.schemes import QuantizedModule

MAKER = Path(__file__).resolve().parents[2] / "fixtures" / "make_quantized.py"
F8 = torch.float8_e4m3fn


def same(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    """Bit-equal (fp8 compared as bytes, NaNs as bit patterns)."""
    if a.dtype == F8 or b.dtype == F8:
        assert a.dtype == b.dtype == F8, (what, a.dtype, b.dtype)
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    assert a.dtype == b.dtype and a.shape == b.shape, (what, a.dtype, b.dtype, a.shape, b.shape)
    if a.is_floating_point():
        a, b = (
            a.contiguous().view(torch.int16 if a.element_size() == 2 else torch.int32),
            b.contiguous().view(torch.int16 if b.element_size() == 2 else torch.int32),
        )
    diff = int((a != b).sum())
    assert diff == 0, f"{what}: {diff} of {a.numel()} differ"


def transformers_ops() -> tuple[Any, Any]:
    from transformers import FineGrainedFP8Config
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize, Fp8Quantize

    quantizer = types.SimpleNamespace(quantization_config=FineGrainedFP8Config(weight_block_size=[128, 128]))
    return Fp8Quantize(quantizer), Fp8Dequantize(quantizer)


def ct_block_dequant(weight: torch.Tensor, scale_inv: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    from compressed_tensors.entrypoints.convert.converters import FP8BlockDequantizer

    return FP8BlockDequantizer(weight_block_size=(128, 128), dtype=dtype)._create_dequantized_weight(
        weight, scale_inv
    )


def block_module(shape: tuple[int, int]) -> QuantizedModule:
    from adapterdoc.quant.schemes import Geometry

    geometry = Geometry(bits=8, block_size=(128, 128), strategy="block", symmetric=True)
    tensors = {".weight": "m.weight", ".weight_scale_inv": "m.weight_scale_inv"}
    return QuantizedModule("m", "fp8-block", tensors, "F8_E4M3", shape, geometry=geometry)


def check_block(
    module: QuantizedModule, stored: dict[str, torch.Tensor], original: torch.Tensor | None, made_by: str
) -> None:
    """decode against transformers' Fp8Dequantize (whole blocks) or compressed-tensors' FP8BlockDequantizer
    (ceil grid), float32 and bf16; encode against transformers' Fp8Quantize (on the weight zero-padded to whole
    blocks where the block does not divide it)."""
    quantize, dequantize = transformers_ops()
    q, s = stored[".weight"], stored[".weight_scale_inv"]
    d = fp8.decode(module, stored)
    rows, cols = q.shape[-2:]
    whole = rows % 128 == 0 and cols % 128 == 0
    grid_rows, grid_cols = s.shape[-2:]
    divides = rows % grid_rows == 0 and cols % grid_cols == 0
    misread = (grid_rows > 1 and rows // grid_rows != 128) or (grid_cols > 1 and cols // grid_cols != 128)
    for dtype in (torch.float32, torch.bfloat16):
        if whole or (divides and not misread):
            reference = dequantize._dequantize_one(q, s, output_dtype=dtype)
        elif divides:
            # transformers takes the block from the grid (rows / grid rows): on a ceil grid that happens to divide
            # the weight (200 x 300 on a 2 x 3 grid) it uses 100 x 100 blocks and scales the wrong weights
            wrong = dequantize._dequantize_one(q, s, output_dtype=dtype)
            assert not torch.equal(wrong, d.values.to(dtype)), "transformers read a ceil grid right"
            reference = ct_block_dequant(q, s, dtype)
        else:
            # transformers refuses a ceil-divided grid (DeepSeek's partial last block)
            try:
                dequantize._dequantize_one(q, s, output_dtype=dtype)
                raise AssertionError("transformers dequantized a ceil grid")
            except ValueError as e:
                assert "not divisible by scale grid" in str(e)
            reference = ct_block_dequant(q, s, dtype)
        same(d.values.to(dtype), reference, f"{module.path} decode {dtype}")
    weight = d.values if original is None else original
    out = fp8.encode(module, weight, stored)
    if whole:
        ref = quantize.convert({"x.weight": weight})
    else:
        # transformers' Fp8Quantize leaves a weight the block does not divide unquantized: surprise kept as an assert
        assert quantize.convert({"x.weight": weight})["x.weight"] is weight
        padded = torch.nn.functional.pad(weight, (0, (-cols) % 128, 0, (-rows) % 128))
        ref = quantize.convert({"x.weight": padded})
        ref["x.weight"] = ref["x.weight"][:rows, :cols].contiguous()
    same(out[".weight"], ref["x.weight"], f"{module.path} encode codes")
    same(out[".weight_scale_inv"], ref["x.weight_scale_inv"], f"{module.path} encode scale_inv")
    if original is not None and made_by == "transformers":
        same(out[".weight"], q, f"{module.path} encode = the stored codes")
        same(out[".weight_scale_inv"], s, f"{module.path} encode = the stored scales")


def ct_scheme(config: dict[str, Any]) -> Any:
    from compressed_tensors.quantization import QuantizationConfig

    return QuantizationConfig.model_validate(config).config_groups["group_0"]


def check_ct(
    module: QuantizedModule, stored: dict[str, torch.Tensor], scheme: Any, original: torch.Tensor | None
) -> None:
    """decode against compressed-tensors' decompress (its bf16 and with float32 scales); encode against what the
    library stored (compressed-tensors made it from ``original``)."""
    from compressed_tensors.compressors.naive_quantized.base import NaiveQuantizationCompressor as C

    d = fp8.decode(module, stored)
    sd = {"weight": stored[".weight"], "weight_scale": stored[".weight_scale"]}
    same(
        d.values.to(stored[".weight_scale"].dtype),
        C.decompress(sd, scheme)["weight"],
        f"{module.path} decode (library dtype)",
    )
    sd32 = {"weight": stored[".weight"], "weight_scale": stored[".weight_scale"].float()}
    same(d.values, C.decompress(sd32, scheme)["weight"], f"{module.path} decode float32")
    if original is not None:
        out = fp8.encode(module, original.float(), stored)
        same(out[".weight"], stored[".weight"], f"{module.path} encode codes")
        same(out[".weight_scale"], stored[".weight_scale"], f"{module.path} encode scale")


def real_bases(root: Path, counts: dict[str, int]) -> None:
    for name in (
        "fp8-transformers",
        "fp8-transformers-576",
        "fp8-deepseek",
        "ct-fp8-block",
        "ct-fp8-dynamic",
    ):
        folder = root / name
        quant = detect_folder(folder)
        state = load_file(folder / "model.safetensors")
        width = "576" if name in ("fp8-transformers-576", "fp8-deepseek", "ct-fp8-block") else "768"
        originals = load_file(root / f"_bf16-{width}" / "model.safetensors")
        scheme = ct_scheme(quant.config) if quant.config and name.startswith("ct-") else None
        for module in quant.modules:
            stored = {s: state[t] for s, t in module.tensors.items()}
            original = originals[module.path + ".weight"].float()
            if scheme is None:
                made_by = "transformers" if name.startswith("fp8-transformers") else "deepseek"
                check_block(module, stored, original, made_by)
                if made_by == "deepseek":
                    check_block(module, stored, None, made_by)
                    # the fixture's DeepSeek rule (W / (amax / 448)) and transformers' (W * (448 / amax)) round a
                    # few codes apart: counted, not asserted
                    codes = fp8.encode(module, original, stored)[".weight"].view(torch.uint8)
                    counts["deepseek-codes-differ"] = counts.get("deepseek-codes-differ", 0) + int(
                        (codes != stored[".weight"].view(torch.uint8)).sum()
                    )
            else:
                check_ct(module, stored, scheme, original)
            counts[name] = counts.get(name, 0) + 1


def random_block(counts: dict[str, int]) -> None:
    """Block FP8 of awkward shapes: whole blocks, partial last blocks both ways, a single partial block."""
    quantize, _ = transformers_ops()
    for i, shape in enumerate([(256, 384), (200, 300), (130, 129), (64, 72), (384, 130)]):
        torch.manual_seed(i)
        w = torch.randn(shape) * 0.02
        w[0, : min(5, shape[1])] = torch.tensor([0.0, 1e-30, -3.0, 448.0, -1e-8])[: min(5, shape[1])]
        module = block_module(shape)
        grid = (-(-shape[0] // 128), -(-shape[1] // 128))
        stored = {".weight": torch.zeros(shape, dtype=F8), ".weight_scale_inv": torch.ones(grid)}
        stored = fp8.encode(module, w, stored)
        check_block(module, stored, w, "random")
        check_block(module, stored, None, "random")
        counts["random-block"] = counts.get("random-block", 0) + 1
    del quantize


def load_maker() -> Any:
    spec = importlib.util.spec_from_file_location("make_quantized", MAKER)
    assert spec and spec.loader
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    return maker


def random_ct(counts: dict[str, int]) -> None:
    """compressed-tensors FP8 strategies on awkward shapes, bf16 and float32 models: the library's own apply,
    calibrate (make_quantized.calibrate: calculate_qparams on min-max), compress, decompress."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
        apply_quantization_config,
    )

    from adapterdoc.quant.schemes import Geometry

    maker = load_maker()
    maker.quiet()
    cases = [
        ("block", (200, 300), torch.bfloat16),
        ("block", (128, 256), torch.float32),
        ("channel", (200, 300), torch.bfloat16),
    ]
    cases += [("tensor", (64, 96), torch.bfloat16), ("channel", (96, 64), torch.float32)]
    for i, (strategy, shape, dtype) in enumerate(cases):
        torch.manual_seed(100 + i)
        linear = torch.nn.Linear(shape[1], shape[0], bias=False).to(dtype)
        linear.weight.data = (torch.randn(shape) * 0.03).to(dtype)
        original = linear.weight.data.float().clone()
        model = torch.nn.Sequential(linear)
        block = [128, 128] if strategy == "block" else None
        weights = QuantizationArgs(
            num_bits=8, type="float", symmetric=True, strategy=strategy, block_structure=block
        )
        config = QuantizationConfig(
            config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=weights)},
            format="float-quantized",
        )
        apply_quantization_config(model, config)
        maker.calibrate(linear)
        ModelCompressor.from_pretrained_model(model).compress_model(model)
        state = {k.removeprefix("0."): v for k, v in model.state_dict().items()}
        stored = {".weight": state["weight"], ".weight_scale": state["weight_scale"]}
        assert stored[".weight_scale"].dtype == dtype
        geometry = Geometry(
            bits=8, block_size=tuple(block) if block else None, strategy=strategy, symmetric=True
        )  # type: ignore[arg-type]
        module = QuantizedModule(
            "m", "ct-fp8", {".weight": "w", ".weight_scale": "s"}, "F8_E4M3", shape, geometry=geometry
        )
        check_ct(module, stored, config.config_groups["group_0"], original)
        counts[f"random-ct-{strategy}"] = counts.get(f"random-ct-{strategy}", 0) + 1


def main(root: Path) -> None:
    counts: dict[str, int] = {}
    real_bases(root, counts)
    random_block(counts)
    random_ct(counts)
    print(json.dumps(counts))


if __name__ == "__main__":
    main(Path(sys.argv[1]))

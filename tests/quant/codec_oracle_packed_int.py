"""Compare adapterdoc.quant.codec.packed_int bit for bit with compressed-tensors and with the published GPTQ / AWQ
code (run in the quant oracle environment by test_codec_packed_int.py -m oracle).

    python codec_oracle_packed_int.py ROOT

gptqmodel and AutoAWQ cannot be installed here (sdist-only, CUDA builds), so their dequantization and packing are
transcribed below from their source, independently of adapterdoc's code:

- gptqmodel (github.com/ModelCloud/GPTQModel @ f4c327a17eb3): ``gptqmodel/utils/model.py``
  ``convert_gptq_v1_to_v2_format_module`` (4-bit: ``qzeros += 0b00010001000100010001000100010001``) and its v2 → v1
  inverse; ``gptqmodel/nn_modules/qlinear/__init__.py`` ``PackableQuantLinear.dequantize_weight`` /
  ``_dequantize_from_codes`` and ``pack_block`` (the Python path: ``round((W + zeros·scales)[g_idx] / scales[g_idx])``,
  ``clamp_(0, maxq)``, 32 rows → ``bits`` words, qzeros by the numpy loop).
- AutoAWQ (github.com/casper-hansen/AutoAWQ @ 88e4c76b2075): ``awq/utils/packing_utils.py`` ``unpack_awq``,
  ``reverse_awq_order``, ``dequantize_gemm``; ``awq/modules/linear/gemm.py`` ``WQLinear_GEMM.from_linear``.

Prints one JSON object: case → modules compared (every difference raises)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from adapterdoc.quant import detect_folder
from adapterdoc.quant.codec import packed_int
from adapterdoc.quant.schemes import Geometry, QuantizedModule

MAKER = Path(__file__).resolve().parents[2] / "fixtures" / "make_quantized.py"


def same(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, (what, a.dtype, b.dtype, a.shape, b.shape)
    if a.is_floating_point():
        view = torch.int16 if a.element_size() == 2 else torch.int32
        a, b = a.contiguous().view(view), b.contiguous().view(view)
    diff = int((a != b).sum())
    assert diff == 0, f"{what}: {diff} of {a.numel()} differ"


# ------------------------------------------------------------------------------ gptqmodel, transcribed


def gptqmodel_v1_to_v2(qzeros: torch.Tensor) -> torch.Tensor:
    out = qzeros.clone()
    out += 0b00010001000100010001000100010001  # int32 addition, carries and wrap included
    return out


def gptqmodel_v2_to_v1(qzeros: torch.Tensor) -> torch.Tensor:
    out = qzeros.clone()
    out -= 0b00010001000100010001000100010001
    return out


def gptqmodel_dequantize(
    qweight: torch.Tensor, qzeros_v1: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor, bits: int = 4
) -> torch.Tensor:
    """``[in, out]`` in the scales' dtype."""
    qzeros = gptqmodel_v1_to_v2(qzeros_v1)
    pack_factor = 32 // bits
    maxq = 2**bits - 1
    dequant_dtype = torch.int16 if bits == 8 else torch.int8
    wf = torch.tensor(list(range(0, 32, bits)), dtype=torch.int32).unsqueeze(0)
    zeros = torch.bitwise_right_shift(
        torch.unsqueeze(qzeros, 2).expand(-1, -1, pack_factor), wf.unsqueeze(0)
    ).to(dequant_dtype)
    zeros = torch.bitwise_and(zeros, maxq).reshape(scales.shape)
    weight = torch.bitwise_and(
        torch.bitwise_right_shift(
            torch.unsqueeze(qweight, 1).expand(-1, pack_factor, -1), wf.unsqueeze(-1)
        ).to(dequant_dtype),
        maxq,
    )
    weight = weight.reshape(weight.shape[0] * weight.shape[1], weight.shape[2])
    return scales[g_idx.long()] * (weight - zeros[g_idx.long()])


def gptqmodel_pack(
    W: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor, bits: int = 4
) -> dict[str, torch.Tensor]:
    """pack_block's Python path; ``scales``/``zeros`` ``[out, G]`` as the quantizer hands them; v1 on return."""
    MASK32 = (1 << 32) - 1
    out_features, in_features = W.shape
    scales = scales.T.contiguous()
    zeros = zeros.T.contiguous()
    scale_zeros = zeros * scales
    maxq = 2**bits - 1
    pack_factor = 32 // bits
    qweight = torch.empty(((in_features // 32) * bits, out_features), dtype=torch.int32)
    shifts_pf64 = (torch.arange(pack_factor, dtype=torch.int64) * bits).view(1, pack_factor, 1)
    gsel = g_idx.to(dtype=torch.int64)
    sz_blk_T = scale_zeros.index_select(0, gsel).T
    s_blk_T = scales.index_select(0, gsel).T
    int_block = torch.round((W + sz_blk_T) / s_blk_T)
    int_block.clamp_(0, maxq)
    int_block = int_block.to(torch.int32).T.contiguous()
    for g in range(in_features // 32):
        r64 = int_block[g * 32 : (g + 1) * 32].to(torch.int64)
        R = r64.view(bits, pack_factor, -1)
        packed64 = (R << shifts_pf64).sum(dim=1, dtype=torch.int64)
        qweight[g * bits : g * bits + bits] = (packed64 & MASK32).to(torch.int32)
    zeros_np = zeros.detach().cpu().numpy().astype(np.uint32, copy=False)
    qzeros_np = np.zeros((zeros_np.shape[0], (zeros_np.shape[1] // 32) * bits), dtype=np.uint32)
    for col in range(qzeros_np.shape[1]):
        for j in range(pack_factor):
            qzeros_np[:, col] |= zeros_np[:, col * pack_factor + j] << (bits * j)
    qzeros = torch.from_numpy(qzeros_np.astype(np.int32, copy=False))
    return {
        ".qweight": qweight,
        ".qzeros": gptqmodel_v2_to_v1(qzeros),
        ".scales": scales.to(torch.float16),
        ".g_idx": g_idx,
    }


# -------------------------------------------------------------------------------- AutoAWQ, transcribed

AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]


def autoawq_dequantize(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int, bits: int = 4
) -> torch.Tensor:
    """``dequantize_gemm``: ``[in, out]`` in the scales' dtype."""
    shifts = torch.arange(0, 32, bits)
    iweights = torch.bitwise_right_shift(qweight[:, :, None], shifts[None, None, :]).to(torch.int8)
    iweights = iweights.view(iweights.shape[0], -1)
    izeros = torch.bitwise_right_shift(qzeros[:, :, None], shifts[None, None, :]).to(torch.int8)
    izeros = izeros.view(izeros.shape[0], -1)
    reverse_order_tensor = torch.arange(iweights.shape[-1], dtype=torch.int32)
    reverse_order_tensor = reverse_order_tensor.view(-1, 32 // bits)
    reverse_order_tensor = reverse_order_tensor[:, AWQ_REVERSE_ORDER]
    reverse_order_tensor = reverse_order_tensor.view(-1)
    izeros = izeros[:, reverse_order_tensor]
    iweights = iweights[:, reverse_order_tensor]
    iweight = torch.bitwise_and(iweights, (2**bits) - 1)
    izeros = torch.bitwise_and(izeros, (2**bits) - 1)
    scales = scales.repeat_interleave(group_size, dim=0)
    izeros = izeros.repeat_interleave(group_size, dim=0)
    return (iweight - izeros) * scales


def autoawq_pack(
    W: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int, clamp: bool = False
) -> dict[str, torch.Tensor]:
    """``WQLinear_GEMM.from_linear`` (4-bit): ``scales``/``zeros`` ``[G, out]``; no clamp, as AutoAWQ, unless
    ``clamp`` (the one deviation, adapterdoc's rule: AutoAWQ's own scales keep the codes in range)."""
    scale_zeros = zeros * scales
    scales_half = scales.clone().half()
    in_features = W.shape[1]
    intweight = []
    for idx in range(in_features):
        intweight.append(
            torch.round((W[:, idx] + scale_zeros[idx // group_size]) / scales_half[idx // group_size]).to(
                torch.int
            )[:, None]
        )
    intweight = torch.cat(intweight, dim=1).t().contiguous().to(dtype=torch.int32)
    if clamp:
        intweight = intweight.clamp(0, 15)
    pack_num = 8
    order_map = [0, 2, 4, 6, 1, 3, 5, 7]
    qweight = torch.zeros((intweight.shape[0], intweight.shape[1] // 32 * 4), dtype=torch.int32)
    for col in range(intweight.shape[1] // pack_num):
        for i in range(pack_num):
            qweight[:, col] |= intweight[:, col * pack_num + order_map[i]] << (i * 4)
    zeros_i = zeros.to(dtype=torch.int32)
    qzeros = torch.zeros((zeros_i.shape[0], zeros_i.shape[1] // 32 * 4), dtype=torch.int32)
    for col in range(zeros_i.shape[1] // pack_num):
        for i in range(pack_num):
            qzeros[:, col] |= zeros_i[:, col * pack_num + order_map[i]] << (i * 4)
    return {".qweight": qweight, ".qzeros": qzeros, ".scales": scales_half}


# -------------------------------------------------------------------------------------------- checks


def gptq_module(shape: tuple[int, int], group: int, desc_act: bool = False) -> QuantizedModule:
    tensors = {s: "m" + s for s in (".qweight", ".qzeros", ".scales", ".g_idx")}
    geometry = Geometry(bits=4, group_size=group, strategy="group", symmetric=True, desc_act=desc_act)
    return QuantizedModule("m", "gptq", tensors, "I32", shape, geometry=geometry)


def awq_module(shape: tuple[int, int], group: int) -> QuantizedModule:
    tensors = {s: "m" + s for s in (".qweight", ".qzeros", ".scales")}
    geometry = Geometry(bits=4, group_size=group, strategy="group", symmetric=False)
    return QuantizedModule("m", "awq", tensors, "I32", shape, geometry=geometry)


def check_gptq(
    module: QuantizedModule, stored: dict[str, torch.Tensor], original: torch.Tensor | None
) -> None:
    q, z, s, g = stored[".qweight"], stored[".qzeros"], stored[".scales"], stored[".g_idx"]
    d = packed_int.decode(module, stored)
    same(d.values, gptqmodel_dequantize(q, z, s.float(), g).t(), f"{module.path} decode float32")
    same(d.values.to(s.dtype), gptqmodel_dequantize(q, z, s, g).t(), f"{module.path} decode fp16")
    zeros = torch.bitwise_and(
        torch.bitwise_right_shift(
            gptqmodel_v1_to_v2(z).unsqueeze(2).expand(-1, -1, 8), torch.arange(0, 32, 4, dtype=torch.int32)
        ),
        15,
    ).reshape(s.shape)
    for weight in (d.values, original):
        if weight is None:
            continue
        out = packed_int.encode(module, weight, stored)
        ref = gptqmodel_pack(weight, s.t(), zeros.t().to(s.dtype), g)
        for suffix in (".qweight", ".qzeros", ".scales", ".g_idx"):
            same(out[suffix], ref[suffix], f"{module.path} encode {suffix}")
    same(packed_int.encode(module, d.values, stored)[".qweight"], q, f"{module.path} re-encode")
    if original is not None:
        assert ((d.values - original).abs() / d.step).max() < 0.52, (
            module.path
        )  # fp16 scales: half a step and a bit


def check_awq(
    module: QuantizedModule, stored: dict[str, torch.Tensor], original: torch.Tensor | None, group: int
) -> None:
    q, z, s = stored[".qweight"], stored[".qzeros"], stored[".scales"]
    d = packed_int.decode(module, stored)
    same(d.values, autoawq_dequantize(q, z, s.float(), group).t(), f"{module.path} decode float32")
    same(d.values.to(s.dtype), autoawq_dequantize(q, z, s, group).t(), f"{module.path} decode fp16")
    zeros = (d.codes.t() - (d.values / d.step).t().round().to(torch.int32))[::group].to(s.dtype)  # [G, out]
    for weight in (d.values, original):
        if weight is None:
            continue
        out = packed_int.encode(module, weight, stored)
        ref = autoawq_pack(weight, s, zeros, group, clamp=True)
        if weight is d.values:  # on the grid, AutoAWQ's unclamped rule gives the same words
            same(
                out[".qweight"],
                autoawq_pack(weight, s, zeros, group)[".qweight"],
                f"{module.path} encode unclamped",
            )
        for suffix in (".qweight", ".qzeros", ".scales"):
            same(out[suffix], ref[suffix], f"{module.path} encode {suffix}")
    same(packed_int.encode(module, d.values, stored)[".qweight"], q, f"{module.path} re-encode")
    if original is not None:
        assert ((d.values - original).abs() / d.step).max() < 0.52, module.path
    # AutoAWQ does not clamp: a weight beyond the grid spills into the neighbouring fields (adapterdoc clamps)
    beyond = d.values.clone()
    beyond[0, 0] = d.values[0, 0] + 40 * d.step[0, 0]
    spilled = autoawq_pack(beyond, s, zeros, group)[".qweight"]
    assert not torch.equal(spilled[0], packed_int.encode(module, beyond, stored)[".qweight"][0])


def real_packed(root: Path, counts: dict[str, int]) -> None:
    originals = load_file(root / "_bf16-768" / "model.safetensors")
    for name in ("gptq", "awq"):
        quant = detect_folder(root / name)
        state = load_file(root / name / "model.safetensors")
        for module in quant.modules:
            stored = {s: state[t] for s, t in module.tensors.items()}
            original = originals[module.path + ".weight"].float()
            if name == "gptq":
                check_gptq(module, stored, original)
            else:
                check_awq(module, stored, original, 128)
            counts[name] = counts.get(name, 0) + 1


def minmax_qparams(
    w: torch.Tensor, group_of: torch.Tensor, groups: int, sym: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, G] float32 scales and zeros from each group's min and max (GPTQ's quantizer without the Hessian)."""
    lo = torch.stack([w[:, group_of == k].amin(1).clamp(max=0) for k in range(groups)], 1)
    hi = torch.stack([w[:, group_of == k].amax(1).clamp(min=0) for k in range(groups)], 1)
    if sym:
        hi = torch.max(lo.abs(), hi)
        lo = -hi
    scale = ((hi - lo) / 15).clamp(min=1e-8)
    zero = torch.full_like(scale, 8.0) if sym else torch.round(-lo / scale).clamp(0, 15)
    return scale, zero


def random_packed(counts: dict[str, int]) -> None:
    """GPTQ with act-order (a permuted g_idx), a partial last group, asymmetric zeros (some 0: the v1 carry);
    AWQ of other shapes."""
    for i, (shape, group, desc_act, sym) in enumerate(
        [
            ((64, 256), 64, True, True),
            ((96, 320), 128, False, True),
            ((32, 256), 32, True, False),
            ((64, 128), 128, False, False),
        ]
    ):
        torch.manual_seed(200 + i)
        w = torch.randn(shape) * 0.02
        groups = math.ceil(shape[1] / group)
        g_idx = (torch.randperm(shape[1]) if desc_act else torch.arange(shape[1])) // group
        if (
            not sym
        ):  # an all-positive group: zero 0, which v1 stores as -1 and gptqmodel reads back with a carry
            w[:, g_idx == 0] = w[:, g_idx == 0].abs()
        scale, zero = minmax_qparams(w, g_idx, groups, sym)
        stored = gptqmodel_pack(w, scale, zero, g_idx.to(torch.int32))
        check_gptq(gptq_module(shape, group, desc_act), stored, w)
        counts["random-gptq"] = counts.get("random-gptq", 0) + 1
    for i, (shape, group) in enumerate([((64, 256), 64), ((128, 384), 128), ((32, 128), 128)]):
        torch.manual_seed(300 + i)
        w = (torch.randn(shape) * 0.02).to(torch.float16).float()
        scale, zero = minmax_qparams(w, torch.arange(shape[1]) // group, shape[1] // group, False)
        stored = autoawq_pack(w, scale.t().contiguous(), zero.t().contiguous(), group, clamp=True)
        check_awq(awq_module(shape, group), stored, w, group)
        counts["random-awq"] = counts.get("random-awq", 0) + 1


# ---------------------------------------------------------------------------------- compressed-tensors


def load_maker() -> Any:
    spec = importlib.util.spec_from_file_location("make_quantized", MAKER)
    assert spec and spec.loader
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    return maker


def ct_module(shape: tuple[int, int], args: Any) -> QuantizedModule:
    suffixes = (".weight_packed", ".weight_scale", ".weight_shape") + (
        () if args.symmetric else (".weight_zero_point",)
    )
    geometry = Geometry(
        bits=args.num_bits,
        group_size=args.group_size,
        strategy=str(getattr(args.strategy, "value", args.strategy)),
        symmetric=args.symmetric,
    )
    return QuantizedModule("m", "ct-w4a16", {s: "m" + s for s in suffixes}, "I32", shape, geometry=geometry)


def check_ct(
    module: QuantizedModule, stored: dict[str, torch.Tensor], scheme: Any, original: torch.Tensor | None
) -> None:
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor as C

    d = packed_int.decode(module, stored)
    sd = {k.removeprefix("."): v for k, v in stored.items()}
    same(
        d.values.to(stored[".weight_scale"].dtype),
        C.decompress(sd, scheme)["weight"],
        f"{module.path} decode (library dtype)",
    )
    same(
        d.values,
        C.decompress({**sd, "weight_scale": sd["weight_scale"].float()}, scheme)["weight"],
        f"{module.path} decode float32",
    )
    if original is not None:
        out = packed_int.encode(module, original, stored)
        for suffix, tensor in stored.items():
            same(out[suffix], tensor, f"{module.path} encode {suffix}")


def real_ct(root: Path, counts: dict[str, int]) -> None:
    from compressed_tensors.quantization import QuantizationConfig

    quant = detect_folder(root / "ct-w4a16")
    scheme = QuantizationConfig.model_validate(quant.config).config_groups["group_0"]
    state = load_file(root / "ct-w4a16" / "model.safetensors")
    originals = load_file(root / "_bf16-768" / "model.safetensors")
    for module in quant.modules:
        stored = {s: state[t] for s, t in module.tensors.items()}
        check_ct(module, stored, scheme, originals[module.path + ".weight"].float())
        counts["ct-w4a16"] = counts.get("ct-w4a16", 0) + 1


def random_ct(counts: dict[str, int]) -> None:
    """pack-quantized of other shapes, asymmetric (zero points packed by rows, a partial word), channel scales,
    8 bits, a float32 model: the library's apply, calibrate (make_quantized.calibrate), compress."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
        apply_quantization_config,
    )

    maker = load_maker()
    maker.quiet()
    cases: list[tuple[tuple[int, int], dict[str, Any], torch.dtype]] = [
        ((24, 384), {"strategy": "group", "group_size": 128, "symmetric": True}, torch.bfloat16),
        ((20, 256), {"strategy": "group", "group_size": 64, "symmetric": False}, torch.bfloat16),
        ((40, 96), {"strategy": "channel", "symmetric": False}, torch.float32),
        (
            (16, 128),
            {"strategy": "group", "group_size": 32, "symmetric": True, "num_bits": 8},
            torch.bfloat16,
        ),
        ((8, 64), {"strategy": "channel", "symmetric": True}, torch.float16),
    ]
    for i, (shape, kwargs, dtype) in enumerate(cases):
        torch.manual_seed(400 + i)
        linear = torch.nn.Linear(shape[1], shape[0], bias=False).to(dtype)
        linear.weight.data = (torch.randn(shape) * 0.03 + (0.01 if i == 1 else 0.0)).to(dtype)
        original = linear.weight.data.float().clone()
        model = torch.nn.Sequential(linear)
        args = QuantizationArgs(**{"num_bits": 4, "type": "int", **kwargs})
        scheme = QuantizationScheme(targets=["Linear"], weights=args)
        apply_quantization_config(
            model, QuantizationConfig(config_groups={"group_0": scheme}, format="pack-quantized")
        )
        maker.calibrate(linear)
        ModelCompressor.from_pretrained_model(model).compress_model(model)
        state = {"." + k.removeprefix("0."): v for k, v in model.state_dict().items()}
        stored = {
            k: v
            for k, v in state.items()
            if k in (".weight_packed", ".weight_scale", ".weight_shape", ".weight_zero_point")
        }
        check_ct(ct_module(shape, args), stored, scheme, original)
        counts["random-ct"] = counts.get("random-ct", 0) + 1
    # compressed-tensors refuses a partial group (304 columns in groups of 128); adapterdoc's decode refuses it too
    linear = torch.nn.Linear(304, 8, bias=False)
    model = torch.nn.Sequential(linear)
    args = QuantizationArgs(num_bits=4, type="int", strategy="group", group_size=128, symmetric=True)
    try:
        apply_quantization_config(
            model,
            QuantizationConfig(
                config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=args)},
                format="pack-quantized",
            ),
        )
        maker.calibrate(linear)
        ModelCompressor.from_pretrained_model(model).compress_model(model)
        raise AssertionError("compressed-tensors packed a partial group")
    except (ValueError, RuntimeError):
        pass


def main(root: Path) -> None:
    counts: dict[str, int] = {}
    real_packed(root, counts)
    random_packed(counts)
    real_ct(root, counts)
    random_ct(counts)
    print(json.dumps(counts))


if __name__ == "__main__":
    main(Path(sys.argv[1]))

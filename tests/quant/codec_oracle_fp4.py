"""Run in the quant oracle environment: adapterdoc.quant.codec.fp4 against compressed-tensors 0.20.1 (NVFP4) and
transformers (MXFP4) themselves, bit for bit.

    python tests/quant/codec_oracle_fp4.py [BASES_DIR]

NVFP4 on random weights of awkward shapes: decode against ``NVFP4PackedCompressor.decompress`` (bf16) and its
``dequantize`` in float32, encode against ``generate_gparam`` + ``calculate_qparams`` + ``compress`` (what
fixtures/make_quantized.py runs). MXFP4 decode against ``convert_moe_packed_tensors`` on random blocks and scales.
Given BASES_DIR: every module of ``ct-nvfp4`` (encode of the bf16 base's weight equal to the stored tensors) and of
``mxfp4`` (decode equal to what transformers loads with ``Mxfp4Config(dequantize=True)`` on the CPU). Prints ``ok N``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

import torch

from adapterdoc.quant import detect_folder, schemes
from adapterdoc.quant.codec import encode, fp4
from adapterdoc.quant.schemes import QuantizedModule

CHECKS = [0]
NV = (".weight_packed", ".weight_scale", ".weight_global_scale")


def same(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, (what, a.dtype, b.dtype, a.shape, b.shape)
    assert (
        torch.equal(a.view(torch.uint8), b.view(torch.uint8)) if a.dtype.itemsize == 1 else torch.equal(a, b)
    ), (
        what,
        (a.float() - b.float()).abs().max(),
    )
    if a.is_floating_point() and a.dtype.itemsize > 1:  # and ±0 alike, bit for bit
        assert torch.equal(torch.signbit(a), torch.signbit(b)), what
    CHECKS[0] += 1


def nvfp4_scheme():  # type: ignore[no-untyped-def]
    from compressed_tensors.quantization import preset_name_to_scheme

    return preset_name_to_scheme("NVFP4A16", ["Linear"])


def library_nvfp4(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """make_quantized.py's calibrate() and compress_model() for one weight."""
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam

    scheme = nvfp4_scheme()
    args = scheme.weights
    groups = w.unflatten(-1, (w.shape[-1] // args.group_size, args.group_size))
    lo, hi = groups.amin(-1), groups.amax(-1)
    global_scale = generate_gparam(w.amin(), w.amax())
    scale, _ = calculate_qparams(lo, hi, args, global_scale=global_scale)
    sd = {"weight": w, "weight_scale": scale, "weight_global_scale": global_scale}  # float32, E4M3 values
    out = NVFP4PackedCompressor.compress(sd, scheme)
    return {"." + k: v for k, v in out.items()}


def library_nvfp4_decode(sd: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.quantization.lifecycle.forward import dequantize

    scheme = nvfp4_scheme()
    if dtype == torch.bfloat16:  # what decompression (and so a dequantized load) yields
        plain = {k[1:]: v for k, v in sd.items()}
        return NVFP4PackedCompressor.decompress(plain, scheme)["weight"]
    packed = sd[".weight_packed"]
    m, n = packed.shape
    unpacked = unpack_fp4_from_uint8(packed, m, n * 2, dtype=dtype)
    scale = sd[".weight_scale"].to(dtype)
    return dequantize(
        unpacked, scale, args=scheme.weights, global_scale=sd[".weight_global_scale"], dtype=dtype
    )


def nvfp4_module(shape: tuple[int, int]) -> QuantizedModule:
    return QuantizedModule("m", schemes.CT_NVFP4, {s: "m" + s for s in NV}, "U8", shape)


def random_nvfp4() -> None:
    torch.manual_seed(0)
    for shape in [(64, 256), (3, 16), (1, 48), (33, 80), (5, 16)]:
        w = torch.randn(shape) * 0.02
        w[0, :16] = 0.0  # a zero group: scale 0 → 0.125 (compressed-tensors' eps for E4M3)
        if shape[0] > 2:
            w[1, :16] *= 1e-6  # a group far below the tensor's absmax: its E4M3 scale underflows
            w[2, 3] = -1e-9  # a tiny negative: −0.0, code 8
            w[2, 4] = -0.0  # negative zero: torch.sign(−0.0) is +0, code 0
        m = nvfp4_module(shape)
        for dtype_in in (torch.float32, torch.bfloat16):
            x = w.to(dtype_in).float()
            lib = library_nvfp4(x)
            # encode quantizes the weight rounded to bf16, as compressed-tensors does in the bf16 models its NVFP4
            # checkpoints come from: equal to the library given the bf16 weight (a float32 model is not matched)
            bf16_lib = library_nvfp4(x.to(torch.bfloat16).float())
            mine = encode(m, x, bf16_lib)
            for k in NV:
                same(mine[k], bf16_lib[k], f"nvfp4 {shape} {dtype_in} encode {k}")
            got = fp4.decode(m, lib)
            same(got.values, library_nvfp4_decode(lib, torch.float32), f"nvfp4 {shape} decode f32")
            same(
                got.values.to(torch.bfloat16),
                library_nvfp4_decode(lib, torch.bfloat16),
                f"nvfp4 {shape} bf16",
            )


def mx_module(blocks: torch.Tensor) -> QuantizedModule:
    experts, rows, groups, _ = blocks.shape
    tensors = {"_blocks": "X_blocks", "_scales": "X_scales"}
    return QuantizedModule("X", schemes.MXFP4, tensors, "U8", (rows, groups * 32), experts)


def random_mxfp4() -> None:
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    torch.manual_seed(1)
    for shape in [(2, 3, 1), (4, 64, 4), (1, 5, 3)]:
        blocks = torch.randint(0, 256, (*shape, 16), dtype=torch.uint8)
        scales = torch.randint(0, 255, shape, dtype=torch.uint8)  # 255 (E8M0 NaN) left out: ldexp gives inf
        scales.view(-1)[0] = 0  # 2^-127: subnormal float32 values
        scales.view(-1)[-1] = 254  # 2^127
        got = fp4.decode(mx_module(blocks), {"_blocks": blocks, "_scales": scales})
        for dtype in (torch.float32, torch.bfloat16):
            lib = convert_moe_packed_tensors(blocks, scales, dtype=dtype)
            want = got.values if dtype == torch.float32 else got.values.to(dtype)
            same(want, lib, f"mxfp4 {shape} decode {dtype}")


def real_nvfp4(root: Path) -> None:
    from safetensors.torch import load_file

    plain = load_file(root / "_bf16-768" / "model.safetensors")
    q = detect_folder(root / "ct-nvfp4")
    stored = load_file(root / "ct-nvfp4" / "model.safetensors")
    assert len(q.modules) == 14
    for m in q.modules:
        sd = {s: stored[t] for s, t in m.tensors.items()}
        got = fp4.decode(m, sd)
        same(got.values, library_nvfp4_decode(sd, torch.float32), f"{m.path} decode f32")
        same(got.values.to(torch.bfloat16), library_nvfp4_decode(sd, torch.bfloat16), f"{m.path} decode bf16")
        written = encode(m, plain[m.path + ".weight"].float(), sd)
        assert set(written) == set(sd)
        for k in sd:
            same(written[k], sd[k], f"ct-nvfp4 {m.path} encode {k} (byte-identical to the saved file)")


def real_mxfp4(root: Path) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, Mxfp4Config

    q = detect_folder(root / "mxfp4")
    assert q.scheme == schemes.MXFP4 and q.method == "mxfp4", q
    assert len(q.modules) == 4 and {m.experts for m in q.modules} == {4}, q.modules
    assert {m.shape for m in q.modules} == {(192, 128), (128, 96)}, q.modules
    stored = load_file(root / "mxfp4" / "model.safetensors")
    plain = load_file(root / "_bf16-gpt-oss" / "model.safetensors")
    model = AutoModelForCausalLM.from_pretrained(
        root / "mxfp4",
        quantization_config=Mxfp4Config(dequantize=True),
        dtype=torch.bfloat16,
        device_map="cpu",
    )
    params = dict(model.named_parameters())
    for m in q.modules:
        sd = {s: stored[t] for s, t in m.tensors.items()}
        got = fp4.decode(m, sd)
        loaded = params[m.path].data
        assert loaded.shape == got.values.shape == plain[m.path].shape, (
            m.path,
            loaded.shape,
            got.values.shape,
        )
        same(got.values.to(torch.bfloat16), loaded, f"{m.path}: transformers' dequantized load")
        err = (got.values - plain[m.path].float()).norm() / plain[m.path].float().norm()
        assert err < 0.2, (m.path, err)  # the OCP rule's floor scales: about 11% here
        assert ((got.values - plain[m.path].float()).abs() <= got.step * 4).all(), m.path


def main(argv: list[str]) -> int:
    random_nvfp4()
    random_mxfp4()
    if argv:
        real_nvfp4(Path(argv[0]))
        real_mxfp4(Path(argv[0]))
    print(f"ok {CHECKS[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""Run in the quant oracle environment: adapterdoc.quant.codec.bnb against bitsandbytes 0.50.2 itself, bit for bit.

    python tests/quant/codec_oracle_bnb.py [BASES_DIR]

Random weights of awkward shapes (odd counts, partial last blocks, zero rows and blocks, every blocksize), then, given
BASES_DIR (fixtures/make_quantized.py's output), every module of ``bnb-nf4``, ``bnb-fp4`` and ``bnb-int8``: decode
against ``dequantize_4bit`` / ``int8_vectorwise_dequant`` on the stored tensors, encode of the bf16 base's weight
against the stored tensors themselves (what bitsandbytes + transformers wrote). Prints ``ok N`` on success.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ["TORCH_COMPILE_DISABLE"] = "1"  # bitsandbytes' pure-torch kernels run eagerly (no recompile noise)

import torch

from adapterdoc.quant import detect_folder, schemes
from adapterdoc.quant.codec import bnb, encode
from adapterdoc.quant.schemes import QuantizedModule

AVX512 = torch.backends.cpu.get_cpu_capability() == "AVX512"

CHECKS = [0]


def same(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, (what, a.dtype, b.dtype, a.shape, b.shape)
    assert torch.equal(
        a.view(torch.uint8) if a.dtype == torch.bfloat16 else a,
        b.view(torch.uint8) if b.dtype == torch.bfloat16 else b,
    ) or (a.is_floating_point() and torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))), (
        what,
        (a.float() - b.float()).abs().max(),
    )
    CHECKS[0] += 1


def module(scheme: str, suffixes: list[str], shape: tuple[int, int]) -> QuantizedModule:
    return QuantizedModule("m", scheme, {s: "m" + s for s in suffixes}, "U8", shape)


def stored_4bit(
    w: torch.Tensor, block: int, quant_type: str, double: bool, storage: torch.dtype = torch.uint8
) -> dict[str, torch.Tensor]:
    import bitsandbytes.functional as F

    q, state = F.quantize_4bit(
        w, blocksize=block, compress_statistics=double, quant_type=quant_type, quant_storage=storage
    )
    out = {".weight": q}
    out.update({".weight." + k: v for k, v in state.as_dict(packed=True).items()})
    return out


def library_dequant_4bit(
    sd: dict[str, torch.Tensor], dtype: torch.dtype, kernel: str = "cpu"
) -> torch.Tensor:
    """bitsandbytes' ``dequantize_4bit`` (the CPU kernel it dispatches to), or its pure-torch default kernel."""
    import bitsandbytes.functional as F
    from bitsandbytes.backends.default.ops import _dequantize_4bit_compute
    from bitsandbytes.backends.utils import _get_4bit_code

    items = {k[len(".weight.") :]: v for k, v in sd.items() if k != ".weight"}
    qs = F.QuantState.from_dict(items, torch.device("cpu"))
    qs.dtype = dtype
    if kernel == "cpu":
        return F.dequantize_4bit(sd[".weight"], qs)
    absmax = qs.absmax
    if qs.nested:
        absmax = F.dequantize_blockwise(qs.absmax, qs.state2) + qs.offset
    code = _get_4bit_code(qs.quant_type, torch.device("cpu"))
    return _dequantize_4bit_compute(sd[".weight"].reshape(-1), absmax, code, qs.blocksize, qs.shape, dtype)


def misindexed(shape: tuple[int, ...], block: int) -> bool:
    """LIBRARY SURPRISE (bitsandbytes 0.50.2, csrc/cpu_ops.cpp ``dequantizeBlockwise4bitCpu``): on an AVX-512 CPU,
    rows whose length is a multiple of 16 but not of the blocksize are dequantized with the absmax indexed as if
    each row held whole blocks (``absmax[row · (n / blocksize) + col / blocksize]``), not the flat blocks
    ``quantize_4bit`` made: wrong values. adapterdoc decodes the flat blocks, as bitsandbytes' pure-torch kernel
    (and its quantizer) do."""
    return AVX512 and shape[-1] % 16 == 0 and shape[-1] % block != 0 and block >= 16


def random_4bit() -> None:
    torch.manual_seed(0)
    shapes = [(64, 256), (3, 100), (5, 7), (1, 130), (64, 62), (33, 17), (1, 1), (7, 64)]
    for quant_type in ("nf4", "fp4"):
        for double in (False, True):
            for shape in shapes:
                for block in (32, 64, 128, 256):
                    w = torch.randn(shape) * 0.02
                    if shape[0] > 2:
                        w[1] = 0.0  # a zero row: a block of zeros where the row fills blocks
                    sd = stored_4bit(w, block, quant_type, double)
                    scheme = schemes.BNB_NF4 if quant_type == "nf4" else schemes.BNB_FP4
                    m = module(scheme, list(sd), shape)
                    got = bnb.decode(m, sd)
                    what = f"{quant_type} double={double} {shape} block {block}"
                    kernel = "default" if misindexed(shape, block) else "cpu"
                    if kernel == "default" and shape[0] > 1:
                        cpu = library_dequant_4bit(sd, torch.float32)
                        assert not torch.equal(got.values, cpu), (
                            what + ": the AVX-512 kernel's misindexing is fixed"
                        )
                    for dtype in (torch.float32, torch.bfloat16):
                        lib = library_dequant_4bit(sd, dtype, kernel)
                        same(got.values.to(dtype), lib, f"{what} decode {dtype} ({kernel} kernel)")
                    written = encode(m, w, sd)
                    assert set(written) == set(sd), (what, set(written) ^ set(sd))
                    for k in sd:
                        same(written[k], sd[k], f"{what} encode {k}")
                    w2 = w + torch.randn(shape) * 0.002
                    sd2 = stored_4bit(w2, block, quant_type, double)
                    written2 = encode(m, w2, sd)
                    for k in sd2:
                        same(written2[k], sd2[k], f"{what} encode a new weight {k}")


def blockwise_is_a_table_lookup() -> None:
    """LIBRARY SURPRISE (bitsandbytes 0.50, csrc/cpu_ops.cpp ``quantize_cpu_impl``): the CPU 8-bit blockwise
    quantizer (double quant's absmax) looks each value up in a 65536-entry table of evenly spaced values, not the
    nearest code: a value just past a midpoint can take the lower code. adapterdoc's table gives the same codes."""
    import bitsandbytes.functional as F

    torch.manual_seed(3)
    a = torch.rand(70000) * 0.05 - 0.025
    q, state = F.quantize_blockwise(a, blocksize=256)
    code = state.code
    scaled = torch.cat([a[i : i + 256] / state.absmax[i // 256] for i in range(0, a.numel(), 256)])
    nearest = torch.bucketize(scaled, (code[:-1] + code[1:]) / 2).to(torch.uint8)
    assert not torch.equal(q, nearest), "bitsandbytes' CPU blockwise quantizer now picks the nearest code"
    mine, absmax = bnb.quantize_blockwise_cpu(a, code, 256)
    same(mine, q, "blockwise codes")
    same(absmax, state.absmax, "blockwise absmax")


def random_storage() -> None:
    """``bnb_4bit_quant_storage`` other than uint8: the packed bytes viewed as that dtype."""
    torch.manual_seed(2)
    for storage in (torch.bfloat16, torch.float32, torch.int8):
        w = torch.randn(64, 128) * 0.02
        sd = stored_4bit(w, 64, "nf4", True, storage)
        assert sd[".weight"].dtype == storage, sd[".weight"].dtype
        m = module(schemes.BNB_NF4, list(sd), (64, 128))
        same(bnb.decode(m, sd).values, library_dequant_4bit(sd, torch.float32), f"storage {storage} decode")
        written = encode(m, w, sd)
        for k in sd:
            same(written[k], sd[k], f"storage {storage} encode {k}")


def random_int8() -> None:
    import bitsandbytes as bnb_lib
    import bitsandbytes.functional as F

    torch.manual_seed(1)
    for shape in [(64, 256), (3, 100), (5, 7), (1, 130), (33, 17), (1, 1)]:
        w = torch.randn(shape) * 0.02
        w[0, 0] = 0.3  # an outlier: no threshold on the weight (Int8Params quantizes with threshold 0)
        param = bnb_lib.nn.Int8Params(w.to(torch.bfloat16), requires_grad=False).to("cpu")
        sd = {".weight": param.data, ".SCB": param.SCB, ".weight_format": torch.tensor(0, dtype=torch.uint8)}
        m = module(schemes.BNB_INT8, list(sd), shape)
        written = encode(m, w.to(torch.bfloat16).float(), sd)
        for k in sd:
            same(written[k], sd[k], f"int8 {shape} encode {k}")
        got = bnb.decode(m, sd)
        same(got.values, F.int8_vectorwise_dequant(sd[".weight"], sd[".SCB"]), f"int8 {shape} decode")
        # and a float32 weight that is not bf16: Int8Params casts it to float16 first
        param32 = bnb_lib.nn.Int8Params(w.clone(), requires_grad=False).to("cpu")
        written32 = encode(m, w, sd)
        same(written32[".weight"], param32.data, f"int8 {shape} f32 codes")
        same(written32[".SCB"], param32.SCB, f"int8 {shape} f32 SCB")


def real(root: Path) -> None:
    import bitsandbytes.functional as F
    from safetensors.torch import load_file

    plain = load_file(root / "_bf16-768" / "model.safetensors")
    for name in ("bnb-nf4", "bnb-fp4", "bnb-int8"):
        q = detect_folder(root / name)
        stored = load_file(root / name / "model.safetensors")
        assert len(q.modules) == 14, (name, len(q.modules))
        for m in q.modules:
            sd = {s: stored[t] for s, t in m.tensors.items()}
            got = bnb.decode(m, sd)
            if m.scheme == schemes.BNB_INT8:
                same(got.values, F.int8_vectorwise_dequant(sd[".weight"], sd[".SCB"]), f"{m.path} decode")
            else:
                same(got.values, library_dequant_4bit(sd, torch.float32), f"{m.path} decode")
                same(
                    got.values.to(torch.bfloat16), library_dequant_4bit(sd, torch.bfloat16), f"{m.path} bf16"
                )
                _, state = bnb.quant_state(sd)
                assert state["dtype"] == "bfloat16", state
            written = encode(m, plain[m.path + ".weight"].float(), sd)
            assert set(written) == set(sd), (m.path, set(written) ^ set(sd))
            for k in sd:
                same(written[k], sd[k], f"{name} {m.path} encode {k} (byte-identical to the saved file)")
        # the JSON is bitsandbytes' own (json.dumps of as_dict's non-tensor items, in its key order)
        key = next(k for k in stored if ".quant_state." in k) if name != "bnb-int8" else None
        if key:
            json.loads(bytes(stored[key].tolist()))


def main(argv: list[str]) -> int:
    blockwise_is_a_table_lookup()
    random_4bit()
    random_storage()
    random_int8()
    if argv:
        real(Path(argv[0]))
    print(f"ok {CHECKS[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

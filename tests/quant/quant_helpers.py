"""Hand-built quantized bases for tests/quant: safetensors files written from (dtype, shape, bytes) and the
``quantization_config`` each library writes (copied from the real libraries' output, see make_quantized.py)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from adapterdoc.st.dtypes import DTYPE_BITS
from adapterdoc.st.header import TensorInfo, serialize_header

Spec = tuple[str, tuple[int, ...]] | tuple[str, tuple[int, ...], bytes]
"""(dtype, shape) of a zero-filled tensor, or (dtype, shape, its bytes)."""


def write_st(path: Path, tensors: dict[str, Spec]) -> Path:
    """A valid safetensors file holding ``tensors`` in the given order."""
    infos: list[TensorInfo] = []
    blobs: list[bytes] = []
    pos = 0
    for name, spec in tensors.items():
        dtype, shape = spec[0], spec[1]
        n = 1
        for d in shape:
            n *= d
        nbytes = n * DTYPE_BITS[dtype] // 8
        data = spec[2] if len(spec) == 3 else bytes(nbytes)  # type: ignore[misc]
        assert len(data) == nbytes, (name, len(data), nbytes)
        infos.append(TensorInfo(name, dtype, tuple(shape), pos, pos + nbytes))
        blobs.append(data)
        pos += nbytes
    body = serialize_header({"format": "pt"}, infos)
    body += b" " * ((8 - len(body) % 8) % 8)
    path.write_bytes(struct.pack("<Q", len(body)) + body + b"".join(blobs))
    return path


def write_base(folder: Path, qc: dict[str, object] | None, tensors: dict[str, Spec]) -> Path:
    """A model folder: ``config.json`` (with ``qc`` as its quantization_config unless None) and one shard."""
    folder.mkdir(parents=True, exist_ok=True)
    config: dict[str, object] = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 768}
    if qc is not None:
        config["quantization_config"] = qc
    (folder / "config.json").write_text(json.dumps(config))
    write_st(folder / "model.safetensors", tensors)
    return folder


def plain(dtype: str = "BF16", layers: int = 1) -> dict[str, Spec]:
    """The unquantized rest of a tiny base: embeddings, norms, lm_head."""
    t: dict[str, Spec] = {"model.embed_tokens.weight": (dtype, (320, 256))}
    for i in range(layers):
        t[f"model.layers.{i}.input_layernorm.weight"] = (dtype, (256,))
    t["model.norm.weight"] = (dtype, (256,))
    t["lm_head.weight"] = (dtype, (320, 256))
    return t


def i64_pair(a: int, b: int) -> bytes:
    return struct.pack("<2q", a, b)


def json_bytes(obj: object) -> tuple[str, tuple[int, ...], bytes]:
    """A U8 tensor holding ``obj`` as JSON (bitsandbytes' quant_state)."""
    data = json.dumps(obj).encode()
    return ("U8", (len(data),), data)


# the quantization_config each library writes (compressed-tensors 0.20.1, transformers 5.25, bitsandbytes 0.50.2)

CT_FP8_BLOCK_QC: dict[str, object] = {
    "config_groups": {
        "group_0": {
            "format": "float-quantized",
            "input_activations": {
                "dynamic": True,
                "group_size": 128,
                "num_bits": 8,
                "strategy": "group",
                "symmetric": True,
                "type": "float",
            },
            "output_activations": None,
            "targets": ["Linear"],
            "weights": {
                "block_structure": [128, 128],
                "dynamic": False,
                "group_size": None,
                "num_bits": 8,
                "strategy": "block",
                "symmetric": True,
                "type": "float",
            },
        }
    },
    "format": "float-quantized",
    "global_compression_ratio": None,
    "ignore": ["lm_head"],
    "kv_cache_scheme": None,
    "quant_method": "compressed-tensors",
    "quantization_status": "compressed",
    "sparsity_config": {},
    "transform_config": {},
    "version": "0.20.1",
}


def ct_qc(fmt: str, weights: dict[str, object], **groups: dict[str, object]) -> dict[str, object]:
    """A compressed-tensors config of one group (``weights``, format ``fmt``) or of the given ``groups``."""
    body = groups or {"group_0": {"format": fmt, "targets": ["Linear"], "weights": weights}}
    return {
        "config_groups": body,
        "format": fmt,
        "ignore": ["lm_head"],
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
        "version": "0.20.1",
    }


CT_CHANNEL_FP8_WEIGHTS = {
    "dynamic": False,
    "num_bits": 8,
    "strategy": "channel",
    "symmetric": True,
    "type": "float",
}
CT_W4A16_WEIGHTS = {
    "dynamic": False,
    "group_size": 128,
    "num_bits": 4,
    "strategy": "group",
    "symmetric": True,
    "type": "int",
}
CT_NVFP4_WEIGHTS = {
    "dynamic": False,
    "group_size": 16,
    "num_bits": 4,
    "scale_dtype": "torch.float8_e4m3fn",
    "strategy": "tensor_group",
    "symmetric": True,
    "type": "float",
}
BNB_INT8_QC: dict[str, object] = {
    "_load_in_4bit": False,
    "_load_in_8bit": True,
    "bnb_4bit_compute_dtype": "float32",
    "bnb_4bit_quant_storage": "uint8",
    "bnb_4bit_quant_type": "fp4",
    "bnb_4bit_use_double_quant": False,
    "llm_int8_enable_fp32_cpu_offload": False,
    "llm_int8_has_fp16_weight": False,
    "llm_int8_skip_modules": None,
    "llm_int8_threshold": 6.0,
    "load_in_4bit": False,
    "load_in_8bit": True,
    "quant_method": "bitsandbytes",
}
BNB_NF4_QC: dict[str, object] = {
    **BNB_INT8_QC,
    "_load_in_4bit": True,
    "_load_in_8bit": False,
    "load_in_4bit": True,
    "load_in_8bit": False,
    "bnb_4bit_compute_dtype": "bfloat16",
    "bnb_4bit_quant_type": "nf4",
    "bnb_4bit_use_double_quant": True,
}

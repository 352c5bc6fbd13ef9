"""Run in the mlx oracle environment: mlx's own ``quantize(mode="mxfp4")`` of each float32 array in an .npz.

    python tests/quant/codec_oracle_mlx.py IN.npz OUT.npz

Writes, per input array ``k`` of shape ``[..., in]``, ``k.blocks`` (the uint32 words viewed as bytes, ``[..., in/32,
16]``: the gpt-oss ``_blocks`` layout) and ``k.scales`` (uint8 ``[..., in/32]``), and ``k.dequant`` (mlx's
``dequantize`` in float32).
"""

from __future__ import annotations

import sys

import mlx.core as mx
import numpy as np


def main(argv: list[str]) -> int:
    out = {}
    for key, w in np.load(argv[0]).items():
        q, s = mx.quantize(mx.array(w), group_size=32, bits=4, mode="mxfp4")
        d = mx.dequantize(q, s, group_size=32, bits=4, mode="mxfp4", dtype=mx.float32)
        words = np.array(q)
        assert words.dtype == np.uint32 and sys.byteorder == "little"
        out[key + ".blocks"] = words.view(np.uint8).reshape(*w.shape[:-1], w.shape[-1] // 32, 16)
        out[key + ".scales"] = np.array(s)
        out[key + ".dequant"] = np.array(d)
    np.savez(argv[1], **out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

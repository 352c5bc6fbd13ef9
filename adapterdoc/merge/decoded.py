"""The maths of a merge into a quantized base (torch): a module's stored tensors read and decoded exactly
(:mod:`adapterdoc.quant.codec`), the adapter's edits applied to the decoded weight in float32 (PEFT's formulas,
:func:`adapterdoc.merge.delta.apply_edits`), and the result cast to the output dtype or, with ``--requantize``,
encoded again in the module's own format. One module is held at a time."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from adapterdoc.errors import UnsupportedInputError
from adapterdoc.merge.delta import AdapterTensors, apply_edits, check_finite, read_tensor, torch_dtype
from adapterdoc.merge.edits import Output, Plan
from adapterdoc.merge.quantized import decoded_name

if TYPE_CHECKING:
    import torch

    from adapterdoc.quant.codec import Decoded
    from adapterdoc.quant.schemes import QuantizedModule

_T = TypeVar("_T")


def stored_tensors(plan: Plan, m: QuantizedModule) -> dict[str, torch.Tensor]:
    """``m``'s stored tensors (suffix → tensor as the file holds it), read from the base."""
    base = plan.base
    headers = {h.path: h for h in base.headers}
    out: dict[str, torch.Tensor] = {}
    for suffix, name in m.tensors.items():
        info = base.tensors[name]
        header = headers[base.tensor_file[name]]
        with open(header.path, "rb") as f:
            out[suffix] = read_tensor(f, header.data_start + info.begin, info.dtype, tuple(info.shape))
    return out


def decode_module(plan: Plan, m: QuantizedModule) -> tuple[Decoded, dict[str, torch.Tensor]]:
    """``m`` decoded (values, codes and steps), and its stored tensors."""
    from adapterdoc.quant.codec import decode

    stored = stored_tensors(plan, m)
    return _undecodable(plan, m, lambda: decode(m, stored)), stored


def decoded_weight(plan: Plan, o: Output) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The decoded weight alone of ``o``'s module (float32, a new tensor), and its stored tensors."""
    from adapterdoc.quant.codec import values

    m = o.quantized
    assert m is not None
    stored = stored_tensors(plan, m)
    w = _undecodable(plan, m, lambda: values(m, stored))
    if plan.requantize or tuple(w.shape) == tuple(o.shape):
        return w, stored
    raise UnsupportedInputError(
        plan.base.spec, f"`{m.path}` decodes to {list(w.shape)}, expected {list(o.shape)}"
    )


def _undecodable(plan: Plan, m: QuantizedModule, run: Callable[[], _T]) -> _T:
    from adapterdoc.quant.codec import NotWritable

    try:
        return run()
    except NotWritable as e:
        raise UnsupportedInputError(plan.base.spec, f"`{m.path}`: {e}") from None


def merged_weight(
    plan: Plan, o: Output, m: QuantizedModule, w: torch.Tensor, tensors: AdapterTensors
) -> torch.Tensor:
    """The decoded weight ``w`` (float32; updated in place where the edits allow) with ``o``'s edits applied."""
    if not o.edits:
        return w
    piece = plan.pieces[decoded_name(m)]
    w = apply_edits(w, o.edits, piece, tensors)
    check_finite(decoded_name(m), w)
    return w


class Reencoder:
    """``--requantize``: each changed module encoded once, its stored tensors handed out one by one, then dropped."""

    def __init__(self, plan: Plan, tensors: AdapterTensors) -> None:
        self.plan = plan
        self.tensors = tensors
        self.pending: dict[str, dict[str, torch.Tensor]] = {}

    def tensor_bytes(self, o: Output) -> memoryview:
        """The bytes of the stored tensor ``o`` of its module, encoded again after the merge."""
        import torch

        m = o.quantized
        assert m is not None
        if m.path not in self.pending:
            self.pending[m.path] = self.encoded(o, m)
        encoded = self.pending[m.path]
        suffix = next(s for s, name in m.tensors.items() if name == o.name)
        t = encoded.pop(suffix)
        if not encoded:
            del self.pending[m.path]
        if t.dtype != torch_dtype(o.dtype) or tuple(t.shape) != tuple(o.shape):
            raise UnsupportedInputError(
                self.plan.base.spec,
                f"`{o.name}` encodes to {t.dtype} {list(t.shape)}, the base stores {o.dtype} {list(o.shape)}",
            )
        return t.contiguous().reshape(-1).view(torch.uint8).numpy().data

    def encoded(self, o: Output, m: QuantizedModule) -> dict[str, torch.Tensor]:
        from adapterdoc.merge.quantized import quant_suffixes
        from adapterdoc.quant.codec import NotWritable, encode

        w, stored = decoded_weight(self.plan, o)
        w = merged_weight(self.plan, o, m, w, self.tensors)
        try:
            out = encode(m, w, stored)
        except NotWritable as e:
            raise UnsupportedInputError(self.plan.base.spec, f"`{m.path}`: {e}") from None
        return {s: out[s] for s in quant_suffixes(m)}

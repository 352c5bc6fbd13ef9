"""The row-block path: reused buffers and the in-place LoRA update write the bytes of the plain path (fresh buffers,
``W.float() + d``), under any block size, thread count and writer delay; and the torch facts it relies on."""
# ruff: noqa: F811  (pytest fixtures imported from test_merge_helpers are shadowed by parameters)

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
import torch
from test_merge_helpers import save_adapter, saved_base  # noqa: F401

import adapterdoc.merge.delta as delta_mod
import adapterdoc.merge.output as write_mod
from adapterdoc.merge import merge


def _weights(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name.endswith(".safetensors")}


CASES = [
    (
        "bf16 base, plain LoRA",
        "bfloat16",
        dict(target_modules=["q_proj", "down_proj"], r=4, lora_alpha=8),
        "auto",
    ),
    (
        "float32 base, cast to float16",
        None,
        dict(target_modules=["v_proj", "up_proj"], r=3, lora_alpha=5),
        "float16",
    ),
    ("scaling 1, cast to float32", "bfloat16", dict(target_modules=["o_proj"], r=2, lora_alpha=2), "float32"),
    ("DoRA rows (not the plain path)", None, dict(target_modules=["q_proj"], use_dora=True, r=2), "bfloat16"),
]


@pytest.mark.parametrize(("name", "base_dtype", "lora", "dtype"), CASES, ids=[c[0] for c in CASES])
def test_reused_buffers_write_the_bytes_of_fresh_ones(
    tmp_path, tiny_model, saved_base, monkeypatch, name, base_dtype, lora, dtype
):
    layout = "ministral3_text"
    tdtype = getattr(torch, base_dtype) if base_dtype else None
    model = tiny_model(layout)
    if tdtype is not None:
        model = model.to(tdtype)
    adapter = save_adapter(model, str(tmp_path / "adapter"), **lora)
    base = saved_base(layout, tdtype)
    monkeypatch.setattr(
        delta_mod, "_BLOCK_BYTES", 1000
    )  # many blocks per tensor, slots reused across tensors
    fast = merge(adapter, base, tmp_path / "fast", dtype=dtype)
    monkeypatch.setattr(write_mod, "Scratch", lambda slots: None)  # fresh buffers, W.float() + d, .to()
    plain = merge(adapter, base, tmp_path / "plain", dtype=dtype)
    assert fast.ok and plain.ok and fast.merged_tensors > 0
    assert _weights(tmp_path / "fast") == _weights(tmp_path / "plain")


def test_a_slow_writer_never_sees_a_reused_slot(tmp_path, tiny_model, saved_base, monkeypatch):
    """Every block waits in the writer (queue full, a job running) while the next ones are computed: a slot reused
    too early would change the bytes written."""
    layout = "ministral3_text"
    adapter = save_adapter(tiny_model(layout), str(tmp_path / "adapter"), target_modules=["q_proj"], r=2)
    base = saved_base(layout)
    monkeypatch.setattr(delta_mod, "_BLOCK_BYTES", 2000)
    ref = merge(adapter, base, tmp_path / "ref")

    def slow_put(self, f, data):
        def job():  # the bytes are taken only now, after the delay, as the real writer takes them
            time.sleep(0.002)
            view = memoryview(data)
            while view:
                view = view[f.write(view) :]

        self._submit(job)

    monkeypatch.setattr(write_mod.Writer, "put", slow_put)
    slow = merge(adapter, base, tmp_path / "slow")
    assert ref.ok and slow.ok
    assert _weights(tmp_path / "slow") == _weights(tmp_path / "ref")


def test_one_or_two_torch_threads_write_the_same_bytes(tmp_path, tiny_model, saved_base, monkeypatch):
    layout = "ministral3_text"
    adapter = save_adapter(tiny_model(layout), str(tmp_path / "adapter"), target_modules=["gate_proj"], r=8)
    base = saved_base(layout)
    before = torch.get_num_threads()
    one = merge(adapter, base, tmp_path / "one")
    monkeypatch.setattr(write_mod, "COMPUTE_THREADS", 2)
    two = merge(adapter, base, tmp_path / "two")
    assert one.ok and two.ok
    assert _weights(tmp_path / "one") == _weights(tmp_path / "two")
    assert torch.get_num_threads() == before  # the merge restores the caller's thread count


def test_torch_facts_the_block_maths_relies_on():
    """Probes, recorded: the product, ``mul_`` and an in-place mixed-dtype add give PEFT's float32 sequence
    ``W.float() + (B @ A) * s`` bit for bit, and so do ``matmul(out=)`` and ``copy_`` into a bfloat16 buffer;
    the fused forms (``addmm(alpha=)``, ``add(alpha=)``) round once and differ."""
    g = torch.Generator().manual_seed(0)
    rows, cols, r = 96, 320, 16
    a = (torch.randn(r, cols, generator=g) * 0.01).bfloat16().float()
    b = (torch.randn(rows, r, generator=g) * 0.01).bfloat16().float()
    w = (torch.randn(rows, cols, generator=g) * 0.02).bfloat16()
    s = 8 / math.sqrt(16) * 0.77  # not a power of two
    d = b @ a
    d.mul_(s)
    ref = w.float().add_(d)
    work = torch.empty(rows * cols)
    mine = torch.matmul(b, a, out=work.view(rows, cols)).mul_(s).add_(w)
    assert torch.equal(mine, ref)
    out = torch.empty(rows, cols, dtype=torch.bfloat16)
    assert torch.equal(out.copy_(mine), ref.to(torch.bfloat16))
    assert not torch.equal(torch.addmm(w.float(), b, a, alpha=s), ref)
    assert not torch.equal(torch.add(w.float(), b @ a, alpha=s), ref)
    # a scaling of 1 multiplies nothing: skipping it is exact
    assert torch.equal((b @ a).mul_(1.0), b @ a)

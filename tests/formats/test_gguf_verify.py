"""detect / describe / verify of GGUF files, header-only: each llama.cpp load failure class is a finding with its
fix. The files are written by llama.cpp's own gguf-py writer; that llama.cpp itself refuses each of them is pinned
by the oracle suite (test_gguf_oracle.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("gguf")

from adapterdoc.errors import AdapterdocError
from adapterdoc.formats import detect as detect_any
from adapterdoc.formats import gguf as fmt
from adapterdoc.formats.gguf.header import read_header
from adapterdoc.formats.gguf.load_rules import verify_gguf
from tests.formats.gguf_helpers import base_tensors, lora_tensors, write_gguf


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("gguf")
    out = {
        "good": write_gguf(d / "good.gguf", "llama", lora_tensors()),
        "base": write_gguf(d / "base.gguf", "llama", base_tensors(), adapter=False),
        "tied": write_gguf(d / "tied.gguf", "llama", base_tensors(tied=True), adapter=False),
    }
    return out


def codes(findings: list) -> list[str]:  # type: ignore[type-arg]
    return sorted({f.code for f in findings if f.severity in ("error", "warning")})


def test_gguf_header_reader_agrees_with_gguf_py(files: dict[str, Path]) -> None:
    import gguf

    for path in files.values():
        ours, theirs = read_header(path), gguf.GGUFReader(path)
        assert set(ours.tensors) == {t.name for t in theirs.tensors}
        for t in theirs.tensors:
            o = ours.tensors[t.name]
            assert o.shape == tuple(int(x) for x in t.shape)
            assert ours.data_start + o.offset == t.data_offset
            assert o.nbytes == t.n_bytes
        assert ours.kv["general.architecture"] == "llama"


def test_gguf_detect_and_describe(files: dict[str, Path], tmp_path: Path) -> None:
    d = fmt.detect(files["good"])
    assert d is not None and d.format == "gguf"
    assert "general.type = adapter" in d.evidence and "adapter.type = lora" in d.evidence
    assert detect_any(files["good"]) == d
    assert fmt.detect(files["base"]) is None  # a model is not an adapter
    (tmp_path / "x.bin").write_bytes(b"not gguf at all")
    assert fmt.detect(tmp_path / "x.bin") is None and fmt.detect(tmp_path) is None
    info = fmt.describe(files["good"])
    assert info["architecture"] == "llama" and info["alpha"] == 8.0 and info["ranks"] == {4: 6}
    row = next(r for r in info["pairs"] if r["tensor"] == "blk.0.attn_k.weight")
    assert row["lora_a"] == [64, 4] and row["lora_b"] == [4, 32] and row["scale"] == 2.0
    assert any("GGUF LoRA" in line for line in fmt.describe_lines(files["good"]))


def test_gguf_header_only_without_numpy(files: dict[str, Path]) -> None:
    """detect, describe and verify run in the light install: no numpy, no gguf package imported."""
    code = (
        "import sys; from pathlib import Path; from adapterdoc.formats import gguf; from adapterdoc.formats.gguf import load_rules as gguf_verify\n"
        f"p = Path({str(files['good'])!r}); b = Path({str(files['base'])!r})\n"
        "assert gguf.detect(p) and gguf.describe(p); gguf_verify.verify_gguf(p, b)\n"
        "bad = [m for m in ('numpy', 'gguf', 'torch') if m in sys.modules]; assert not bad, bad"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_gguf_verify_clean(files: dict[str, Path]) -> None:
    found = verify_gguf(files["good"], files["base"])
    assert codes(found) == []
    assert [f.code for f in found] == ["AD862"]  # the scale line


def _variant(tmp: Path, name: str, tensors=None, kv=None, arch: str = "llama") -> Path:  # type: ignore[no-untyped-def]
    return write_gguf(tmp / f"{name}.gguf", arch, lora_tensors() if tensors is None else tensors, kv=kv)


def test_gguf_verify_failure_classes(files: dict[str, Path], tmp_path: Path) -> None:
    import numpy as np

    base = files["base"]
    t = lora_tensors()
    assert codes(verify_gguf(_variant(tmp_path, "arch", arch="qwen3"), base)) == ["AD852"]
    assert codes(
        verify_gguf(_variant(tmp_path, "type", kv={"adapter.type": "cvec", "adapter.lora.alpha": 8.0}), base)
    ) == ["AD851"]
    assert codes(verify_gguf(_variant(tmp_path, "noalpha", kv={"adapter.type": "lora"}), base)) == ["AD858"]
    # an alpha that is not a FLOAT32 (here UINT32 8): llama.cpp's gguf_get_val_f32 aborts the process (pinned by
    # test_gguf_oracle_load_failures_match_verify), so this is an error, not the missing-alpha warning
    found = verify_gguf(
        _variant(tmp_path, "intalpha", kv={"adapter.type": "lora", "adapter.lora.alpha": 8}), base
    )
    bad = [f for f in found if f.code == "AD858"]
    assert len(bad) == 1 and bad[0].severity == "error" and "UINT32, not a FLOAT32" in bad[0].message
    assert [f.code for f in found if f.severity == "error"] == ["AD858"]
    kv = {"general.type": 7, "adapter.type": "lora", "adapter.lora.alpha": 8.0}
    found = verify_gguf(write_gguf(tmp_path / "inttype.gguf", "llama", t, kv=kv, adapter=False), base)
    assert [f.code for f in found if f.severity == "error"] == ["AD850"]
    assert "UINT32, not a STRING: llama.cpp aborts" in found[0].message
    assert codes(
        verify_gguf(_variant(tmp_path, "suffix", {**t, "rope_freqs.weight": np.ones(8, np.float32)}), base)
    ) == ["AD853"]
    assert codes(
        verify_gguf(
            _variant(tmp_path, "norm", {**t, "blk.0.attn_norm.weight": np.ones(64, np.float32)}), base
        )
    ) == ["AD860"]
    half = {k: v for k, v in t.items() if k != "blk.1.attn_q.weight.lora_b"}
    assert codes(verify_gguf(_variant(tmp_path, "half", half), base)) == ["AD854"]
    extra = {
        **t,
        "blk.5.attn_q.weight.lora_a": t["blk.0.attn_q.weight.lora_a"],
        "blk.5.attn_q.weight.lora_b": t["blk.0.attn_q.weight.lora_b"],
    }
    missing = verify_gguf(_variant(tmp_path, "missing", extra), base)
    assert codes(missing) == ["AD855"] and missing[0].key == "blk.5.attn_q.weight"
    wide = {**t, "blk.0.attn_q.weight.lora_a": np.zeros((4, 128), np.float32)}
    assert codes(verify_gguf(_variant(tmp_path, "shape", wide), base)) == ["AD856"]
    flipped = {**t, "blk.0.attn_q.weight.lora_b": np.zeros((64, 5), np.float32)}
    assert codes(verify_gguf(_variant(tmp_path, "rank", flipped), base)) == ["AD857"]
    not_adapter = write_gguf(tmp_path / "m.gguf", "llama", t, adapter=False)
    assert "AD850" in codes(verify_gguf(not_adapter, base))
    assert codes(verify_gguf(files["good"], files["good"])) == ["AD861"]


def test_gguf_verify_hints(files: dict[str, Path], tmp_path: Path) -> None:
    """The fixes name the cause: a tied base for output.weight, a --fuse-qkv base for attn_q."""
    import numpy as np

    t = lora_tensors()
    head = {
        **t,
        "output.weight.lora_a": np.zeros((4, 64), np.float32),
        "output.weight.lora_b": np.zeros((256, 4), np.float32),
    }
    f = [x for x in verify_gguf(_variant(tmp_path, "head", head), files["tied"]) if x.code == "AD855"]
    assert len(f) == 1 and "ties its output" in (f[0].hint or "")
    fused = {k.replace("attn_q.", "attn_qkv."): v for k, v in base_tensors().items()}
    fused_base = write_gguf(tmp_path / "fused.gguf", "llama", fused, adapter=False)
    f = [x for x in verify_gguf(files["good"], fused_base) if x.code == "AD855"]
    assert f and all("--fuse-qkv" in (x.hint or "") for x in f)


def test_gguf_truncated_and_corrupt(files: dict[str, Path], tmp_path: Path) -> None:
    raw = files["good"].read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(raw[:-100])
    assert "AD859" in codes(verify_gguf(cut, files["base"]))
    head = tmp_path / "head.gguf"
    head.write_bytes(raw[:40])
    with pytest.raises(AdapterdocError, match="truncated GGUF header"):
        read_header(head)
    assert fmt.detect(head) is not None  # the magic says GGUF; convert/verify then name what is wrong
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(AdapterdocError, match="base model's GGUF file as --base"):
        verify_gguf(files["good"], tmp_path / "config.json")


def test_gguf_verify_stacked_expert_count(tmp_path: Path) -> None:
    """Stacked experts of another count: llama.cpp checks ne[0] and ne[1] only and loads the adapter (pinned by
    test_gguf_oracle_stacked_expert_count), so the finding says what happens instead of 'refuses'."""
    import numpy as np

    base = write_gguf(
        tmp_path / "moe.gguf", "qwen3moe", {"blk.0.ffn_gate_exps.weight": np.zeros((4, 32, 64), np.float32)},
        adapter=False,
    )  # fmt: skip

    def lora(e: int) -> Path:
        return write_gguf(
            tmp_path / f"e{e}.gguf", "qwen3moe",
            {"blk.0.ffn_gate_exps.weight.lora_a": np.zeros((e, 4, 64), np.float32),
             "blk.0.ffn_gate_exps.weight.lora_b": np.zeros((e, 32, 4), np.float32)},
        )  # fmt: skip

    assert codes(verify_gguf(lora(4), base)) == []
    flat = write_gguf(
        tmp_path / "flat.gguf", "qwen3moe",
        {"blk.0.ffn_gate_exps.weight.lora_a": np.zeros((4, 64), np.float32),
         "blk.0.ffn_gate_exps.weight.lora_b": np.zeros((32, 4), np.float32)},
    )  # fmt: skip
    found = [f for f in verify_gguf(flat, base) if f.severity == "error"]
    assert [f.code for f in found] == ["AD856"] and "experts 1..3 past the end" in found[0].message
    for e, what in ((2, "reads the pairs of experts 2..3 past the end"), (8, "uses the first 4 of its 8")):
        found = [f for f in verify_gguf(lora(e), base) if f.severity == "error"]
        assert [f.code for f in found] == ["AD856"], e
        assert "llama.cpp loads the adapter" in found[0].message and what in found[0].message
        assert "refuses" not in found[0].message and "4 experts per layer" in (found[0].hint or "")

"""llama.cpp's own code as the oracle for GGUF LoRA (``-m oracle``; environment: .ci/oracles/llama_cpp.sh).

For each family llama.cpp converts: the base converted by llama.cpp's ``convert_hf_to_gguf.py`` (f32), our LoRA
GGUF loaded on it by llama.cpp (``Llama(model_path, lora_path)``: ``llama_adapter_lora_init`` +
``llama_set_adapters_lora``) gives PEFT's logits; our file equals ``convert_lora_to_gguf.py``'s tensor for tensor
where that script works; ``verify`` against the real base GGUF is clean, and each failure class it reports is one
llama.cpp refuses with the message the finding quotes.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.formats import gguf as fmt
from adapterdoc.formats.gguf.header import read_header
from adapterdoc.formats.gguf.load_rules import verify_gguf
from tests.formats.gguf_helpers import (
    LINEAR,
    LINEAR_ATTN,
    fused_expert_peft,
    generic_model,
    llama_cpp_qwen35,
    peft_adapter,
    write_gguf,
)

pytestmark = [pytest.mark.oracle, pytest.mark.ml]
DRIVER = Path(__file__).with_name("gguf_oracle_driver.py")
IDS = [3, 17, 42, 5, 99, 7, 23, 64, 11, 2]
TOL = 5e-4
"""Absolute logit tolerance, f32 GGUF: llama.cpp's kernels (tiled f32 dot products, its own RMSNorm/RoPE/softmax)
against torch's, on logits of magnitude ~1; the adapter moves them by > 100× that."""


def drive(python: Path, *args: Any, ok: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [str(python), str(DRIVER), *map(str, args)], capture_output=True, text=True, timeout=900, env=_env()
    )
    if ok:
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return r


def _env() -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return {**env, "GGML_NO_BACKTRACE": "1"}  # a GGML_ASSERT aborts at once (no gdb attached for a backtrace)


@pytest.fixture(scope="module")
def llama(oracle_env, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:  # type: ignore[no-untyped-def]
    python = oracle_env("llama_cpp")
    spm = tmp_path_factory.mktemp("spm")
    drive(python, "spm", spm)
    return {"python": python, "tokenizer": spm / "tokenizer.model"}


def _torch_logits(model: Any, ids: list[int]) -> Any:
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def _base(llama: dict[str, Path], tmp: Path, model: Any, name: str = "base") -> tuple[Path, Path]:
    """The base folder (weights + SentencePiece tokenizer) and llama.cpp's f32 GGUF of it."""
    base_dir = tmp / name
    model.config.architectures = [type(model).__name__]
    model.save_pretrained(base_dir)
    shutil.copy(llama["tokenizer"], base_dir / "tokenizer.model")
    base_gguf = tmp / f"{name}.gguf"
    drive(llama["python"], "base", base_dir, base_gguf)
    return base_dir, base_gguf


def _load(llama: dict[str, Path], base_gguf: Path, *loras: Path) -> dict[str, dict[str, Any]]:
    """llama.cpp's ``llama_adapter_lora_init`` on each file: ``{name: {"loaded", "errors"}}`` (the driver's load)."""
    import json

    r = drive(llama["python"], "load", base_gguf, *loras)
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == len(loras), r.stdout + r.stderr[-2000:]
    return {Path(row["path"]).name: row for row in rows}


def _case(
    llama: dict[str, Path], tmp: Path, model: Any, merged: bool = False, kv: str = "f16", **lora: Any
) -> dict[str, Any]:
    """Base folder (weights + SentencePiece tokenizer) → llama.cpp's base GGUF; PEFT adapter → our GGUF; logits of
    PEFT, of llama.cpp with our adapter, and of both bases. ``merged``: also llama.cpp's logits of the PEFT-merged
    model (``merge_and_unload``, saved beside the same tokenizer, converted by ``convert_hf_to_gguf.py``):
    ``got_merged``. ``kv``: llama.cpp's KV cache type in every run (the driver's ``logits``)."""
    import copy

    import numpy as np
    from peft import PeftModel

    base_dir, base_gguf = _base(llama, tmp, model)
    want_base = _torch_logits(model, IDS)
    adapter = peft_adapter(model, tmp / "peft", **lora)
    peft_model = PeftModel.from_pretrained(model, adapter).eval()
    want = _torch_logits(peft_model, IDS)
    peft_model.unload()
    ours = tmp / "ours.gguf"
    fmt.from_peft(adapter, ours, base=str(base_dir), outtype="f32")
    drive(llama["python"], "logits", base_gguf, "-", ",".join(map(str, IDS)), tmp / "b.npy", kv)
    drive(llama["python"], "logits", base_gguf, ours, ",".join(map(str, IDS)), tmp / "l.npy", kv)
    extra: dict[str, Any] = {}
    if merged:
        folded = PeftModel.from_pretrained(copy.deepcopy(model), adapter).merge_and_unload().eval()
        _, merged_gguf = _base(llama, tmp, folded, name="merged")
        drive(llama["python"], "logits", merged_gguf, "-", ",".join(map(str, IDS)), tmp / "m.npy", kv)
        extra = {"merged_gguf": merged_gguf, "got_merged": np.load(tmp / "m.npy")}
    return {
        **extra,
        "base_dir": base_dir,
        "base_gguf": base_gguf,
        "adapter": adapter,
        "ours": ours,
        "want": want,
        "want_base": want_base,
        "got_base": np.load(tmp / "b.npy"),
        "got": np.load(tmp / "l.npy"),
    }


def _check_logits(c: dict[str, Any]) -> None:
    import numpy as np

    effect = np.abs(c["want"] - c["want_base"]).max()
    assert effect > 100 * TOL, f"the adapter moves the logits by only {effect}"
    assert np.abs(c["got_base"] - c["want_base"]).max() <= TOL  # llama.cpp's base is transformers' base
    err = np.abs(c["got"] - c["want"]).max()
    assert err <= TOL, f"llama.cpp + our LoRA differs from PEFT by {err} (adapter effect {effect})"
    assert codes_of(verify_gguf(c["ours"], c["base_gguf"])) == []


def codes_of(findings: list[Any]) -> list[str]:
    return sorted({f.code for f in findings if f.severity in ("error", "warning")})


def _anchor(llama: dict[str, Path], c: dict[str, Any], tmp: Path) -> None:
    """Our file equals convert_lora_to_gguf.py's tensor for tensor (names, ggml shapes, types, bytes)."""
    import gguf
    import numpy as np

    theirs = tmp / "theirs.gguf"
    drive(llama["python"], "lora", c["adapter"], c["base_dir"], theirs)
    a, b = gguf.GGUFReader(c["ours"]), gguf.GGUFReader(theirs)
    ta, tb = {t.name: t for t in a.tensors}, {t.name: t for t in b.tensors}
    assert set(ta) == set(tb)
    for name, t in ta.items():
        u = tb[name]
        assert (list(t.shape), t.tensor_type) == (list(u.shape), u.tensor_type), name
        assert np.array_equal(np.asarray(t.data), np.asarray(u.data)), name
    alpha = next(f for f in b.fields.values() if f.name == "adapter.lora.alpha")
    assert float(alpha.parts[-1][0]) == read_header(c["ours"]).kv["adapter.lora.alpha"]
    # and the script's file (no adapterdoc metadata) comes back to PEFT's tensors through llama.cpp's name map
    from safetensors.numpy import load_file

    fmt.to_peft(theirs, tmp / "theirs-peft", base=str(c["base_dir"]), outtype=None)
    src = load_file(c["adapter"] / "adapter_model.safetensors")
    got = load_file(tmp / "theirs-peft" / "adapter_model.safetensors")
    assert set(got) == set(src) and all(np.array_equal(got[k], src[k]) for k in src)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_gguf_oracle_generic_decoders(llama, tmp_path: Path, kind: str) -> None:  # type: ignore[no-untyped-def]
    c = _case(llama, tmp_path, generic_model(kind), r=4, lora_alpha=8, target_modules=LINEAR)
    _check_logits(c)
    _anchor(llama, c, tmp_path)
    back = tmp_path / "back"
    fmt.to_peft(c["ours"], back, base=None, outtype=None)
    for f in ("adapter_config.json", "adapter_model.safetensors"):
        assert (back / f).read_bytes() == (c["adapter"] / f).read_bytes()


def test_gguf_oracle_rank_pattern_and_rslora(llama, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Per-pair ranks (llama.cpp's alpha / rank of each pair) and rsLoRA folded into alpha give PEFT's logits;
    convert_lora_to_gguf.py ignores use_rslora (its alpha is lora_alpha): ours is right where it is not."""
    model = generic_model("llama")
    c = _case(
        llama, tmp_path / "rp", model, r=4, lora_alpha=8, rank_pattern={"down_proj": 8}, target_modules=LINEAR
    )
    _check_logits(c)
    c = _case(llama, tmp_path / "rs", model, r=4, lora_alpha=3, use_rslora=True, target_modules=LINEAR)
    _check_logits(c)
    assert read_header(c["ours"]).kv["adapter.lora.alpha"] == 6.0


def test_gguf_oracle_embedding_and_lm_head(llama, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """token_embd's transposed lora_a (llm_build_inp_embd) and output.weight give PEFT's logits in llama.cpp."""
    c = _case(
        llama,
        tmp_path,
        generic_model("llama"),
        r=4,
        lora_alpha=8,
        target_modules=["q_proj", "embed_tokens", "lm_head"],
    )
    _check_logits(c)


@pytest.mark.parametrize(
    "layout",
    [
        "qwen3_5_text",
        "qwen3_5_moe_text",
        "qwen3_moe_text",
        "ministral3_text",
    ],
)
def test_gguf_oracle_registry_families(llama, tmp_path: Path, tiny_model, layout: str) -> None:  # type: ignore[no-untyped-def]
    """The registry's text families: llama.cpp gives PEFT's logits with our file, which equals
    convert_lora_to_gguf.py's output (the Qwen3.5 V-head tiling included; Qwen3.5's tiny base with M-RoPE sections
    llama.cpp can run: tests.formats.gguf_helpers.llama_cpp_qwen35). For Ministral 3 that script writes the
    base model instead of the adapter (its Mistral3Model dispatches writing to an inner class that reads the base's
    weights), so ours is the only working GGUF there: pinned."""
    model = llama_cpp_qwen35(layout) if layout.startswith("qwen3_5") else tiny_model(layout)
    targets = (
        [*LINEAR, *LINEAR_ATTN] if layout.startswith("qwen3_5") else ["q_proj", "k_proj", "v_proj", "o_proj"]
    )
    c = _case(llama, tmp_path, model, r=4, lora_alpha=8, target_modules=targets)
    _check_logits(c)
    if layout != "ministral3_text":
        _anchor(llama, c, tmp_path)
        return
    theirs = tmp_path / "theirs.gguf"
    drive(llama["python"], "lora", c["adapter"], c["base_dir"], theirs)
    h = read_header(theirs)
    assert "token_embd.weight" in h.tensors  # the base's weights, not an adapter
    assert codes_of(verify_gguf(theirs, c["base_gguf"]))  # and verify says llama.cpp would refuse it


ASSERT = "GGML_ASSERT(type_to_gguf_type<T>::value == type) failed"
"""ggml's gguf.cpp when a metadata value is read as another GGUF type than it has: the process aborts."""


def test_gguf_oracle_load_failures_match_verify(llama, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Each failure class verify reports on a GGUF LoRA is one llama.cpp itself refuses, and the finding quotes
    llama.cpp's reason and names the fix: refusals read from llama.cpp's log (``llama_log_set``) after its own
    ``llama_adapter_lora_init`` returns NULL; the checks llama.cpp makes by GGML_ASSERT abort the process
    (SIGABRT). What llama.cpp accepts (no alpha, norm vectors) loads, and verify warns, no error. And how
    llama-cpp-python 0.3.36 reports a refusal: it does not (``Llama(lora_path=...)`` misses the NULL, see the
    driver), the process dies by SIGSEGV after llama.cpp logged the reason on stderr."""
    import signal

    import gguf
    import numpy as np

    model = generic_model("llama")
    base_dir, base_gguf = _base(llama, tmp_path, model)
    adapter = peft_adapter(model, tmp_path / "peft", r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    ours = tmp_path / "ours.gguf"
    fmt.from_peft(adapter, ours, base=str(base_dir), outtype="f32")
    good = {t.name: np.array(t.data) for t in gguf.GGUFReader(ours).tensors}
    qa, qb = good["blk.0.attn_q.weight.lora_a"], good["blk.0.attn_q.weight.lora_b"]
    lora = {"adapter.type": "lora", "adapter.lora.alpha": 8.0}
    q0 = "blk.0.attn_q.weight"
    # code: (tensors, metadata, the phrase llama.cpp's reason and verify's finding share, the key both name)
    refused = {
        "AD850": (good, {"general.type": "model", **lora}, "expect general.type to be 'adapter', but got: model",
                  "general.type"),
        "AD851": (good, {"adapter.type": "control_vector", "adapter.lora.alpha": 8.0},
                  "expect adapter.type to be 'lora', but got: control_vector", "adapter.type"),
        "AD852": (good, None, "model arch and LoRA arch mismatch", "general.architecture"),
        "AD853": ({**good, "rope_freqs.weight": np.ones(8, np.float32)}, None, "has unexpected suffix",
                  "rope_freqs.weight"),
        "AD854": ({k: v for k, v in good.items() if k != f"{q0}.lora_b"}, None, "missing one component", q0),
        "AD855": ({**good, "blk.9.attn_q.weight.lora_a": qa, "blk.9.attn_q.weight.lora_b": qb}, None,
                  "does not exist in base model", "blk.9.attn_q.weight"),
        "AD856": ({**good, f"{q0}.lora_a": np.zeros((4, 128), np.float32)}, None, "has incorrect shape", q0),
        "AD857": ({**good, f"{q0}.lora_b": np.zeros((64, 8), np.float32)}, None, "lora_a tensor is not transposed",
                  q0),
    }  # fmt: skip
    files = {}
    for code, (tensors, kv, _, _) in refused.items():
        arch = "qwen3" if code == "AD852" else "llama"
        plain = kv is not None and "general.type" in kv  # a model's general.type instead of 'adapter'
        files[code] = write_gguf(tmp_path / f"{code}.gguf", arch, tensors, kv=kv, adapter=not plain)
    files["AD859"] = tmp_path / "AD859.gguf"
    files["AD859"].write_bytes(ours.read_bytes()[:-100])  # cut short: the last tensor's data
    last = max(read_header(ours).tensors.values(), key=lambda t: t.offset).name
    refused["AD859"] = (
        good,
        None,
        "data is not within the file bounds, file is corrupted or incomplete",
        last,
    )
    accepted = {
        "ours": ours,
        "AD858": write_gguf(tmp_path / "AD858.gguf", "llama", good, kv={"adapter.type": "lora"}),
        "AD860": write_gguf(
            tmp_path / "AD860.gguf", "llama", {**good, "blk.0.attn_norm.weight": np.ones(64, np.float32)}
        ),
    }
    got = _load(llama, base_gguf, *files.values(), *accepted.values())
    for code, (_, _, phrase, key) in refused.items():
        row = got[files[code].name]
        assert not row["loaded"] and len(row["errors"]) == 1, (code, row)
        assert "failed to apply lora adapter: " in row["errors"][0] and phrase in row["errors"][0], (
            code,
            row,
        )
        errors = [f for f in verify_gguf(files[code], base_gguf) if f.severity == "error"]
        assert [f.code for f in errors] == [code], (code, errors)
        assert phrase in errors[0].message and errors[0].hint, (code, errors[0])
        assert key in {f.key for f in errors}, (code, errors)
        if key.startswith(("blk.", "rope_")) and code != "AD857":  # (llama.cpp's AD857 reason names none)
            assert f"'{key}'" in row["errors"][0], (code, row)  # llama.cpp names the same tensor
    for name, path in accepted.items():
        assert got[path.name] == {"path": str(path), "loaded": True, "errors": []}, name
        found = verify_gguf(path, base_gguf)
        assert not [f for f in found if f.severity == "error"]
        assert codes_of(found) == ([] if name == "ours" else [name])
    # metadata of the wrong GGUF type: llama.cpp's gguf_get_val_* asserts, the process aborts
    for code, kv in {
        "AD858": {"adapter.type": "lora", "adapter.lora.alpha": 8},  # UINT32
        "AD850": {"general.type": 7, **lora},  # UINT32
    }.items():
        path = write_gguf(tmp_path / f"{code}-type.gguf", "llama", good, kv=kv, adapter=code != "AD850")
        r = drive(llama["python"], "load", base_gguf, path, ok=False)
        assert r.returncode == -signal.SIGABRT and ASSERT in r.stderr, (code, r.returncode, r.stderr[-800:])
        errors = [f for f in verify_gguf(path, base_gguf) if f.severity == "error"]
        assert [f.code for f in errors] == [code] and ASSERT in errors[0].message and errors[0].hint
    # llama-cpp-python's own Llama(lora_path=...) on a refused adapter: llama.cpp's reason on stderr, then SIGSEGV
    r = drive(llama["python"], "logits", base_gguf, files["AD852"], "1,2", tmp_path / "x.npy", ok=False)
    assert r.returncode == -signal.SIGSEGV, (r.returncode, r.stdout[-500:], r.stderr[-1500:])
    assert "failed to apply lora adapter: model arch and LoRA arch mismatch" in r.stderr
    assert "LOAD-FAILED" not in r.stdout  # no Python exception was raised


def test_gguf_oracle_stacked_expert_count(llama, tmp_path: Path, tiny_model) -> None:  # type: ignore[no-untyped-def]
    """Stacked expert LoRA (``ffn_*_exps``, ne [in, r, E]) of another expert count than the base's: llama.cpp checks
    ne[0] and ne[1] only and loads it; with more experts it runs on the first E and ignores the rest (the logits
    equal those of the file cut to E). verify's AD856 says exactly that instead of 'refuses'."""
    import numpy as np

    model = tiny_model("qwen3_moe_text")
    n_exp = model.config.num_experts
    _, base_gguf = _base(llama, tmp_path, model)
    rng = np.random.default_rng(0)
    hidden, ff = model.config.hidden_size, model.config.moe_intermediate_size
    a = rng.standard_normal((2 * n_exp, 4, hidden)).astype(np.float32)
    b = rng.standard_normal((2 * n_exp, ff, 4)).astype(np.float32)
    files = {}
    for e in (n_exp // 2, n_exp, 2 * n_exp):
        t = {"blk.0.ffn_gate_exps.weight.lora_a": a[:e], "blk.0.ffn_gate_exps.weight.lora_b": b[:e]}
        files[e] = write_gguf(tmp_path / f"e{e}.gguf", "qwen3moe", t)
    got = _load(llama, base_gguf, *files.values())
    assert all(row["loaded"] and row["errors"] == [] for row in got.values()), got
    assert codes_of(verify_gguf(files[n_exp], base_gguf)) == []
    for e in (n_exp // 2, 2 * n_exp):
        errors = [f for f in verify_gguf(files[e], base_gguf) if f.severity == "error"]
        assert [f.code for f in errors] == ["AD856"] and "llama.cpp loads the adapter" in errors[0].message
    ids = ",".join(map(str, IDS))
    drive(llama["python"], "logits", base_gguf, files[n_exp], ids, tmp_path / "e.npy")
    drive(llama["python"], "logits", base_gguf, files[2 * n_exp], ids, tmp_path / "more.npy")
    drive(llama["python"], "logits", base_gguf, "-", ids, tmp_path / "base.npy")
    same, base = np.load(tmp_path / "e.npy"), np.load(tmp_path / "base.npy")
    assert np.array_equal(np.load(tmp_path / "more.npy"), same) and not np.array_equal(same, base)


@pytest.mark.parametrize("layout", ["qwen3_moe_text", "qwen3_5_moe_text"])
def test_gguf_oracle_expert_lora(llama, tmp_path: Path, tiny_model, cli, layout: str) -> None:  # type: ignore[no-untyped-def]
    """Expert LoRA: PEFT's fused form (target_parameters, what PEFT trains on transformers 5's fused experts),
    ``remap --experts per-expert``, then our GGUF (stacked ``ffn_*_exps``): llama.cpp's routed experts with it give
    PEFT's logits of the fused adapter."""
    import numpy as np
    from peft import PeftModel

    model = llama_cpp_qwen35(layout) if layout.startswith("qwen3_5") else tiny_model(layout)
    base_dir, base_gguf = _base(llama, tmp_path, model)
    want_base = _torch_logits(model, IDS)
    fused = tmp_path / "fused"
    pm = fused_expert_peft(model, fused, r=4, std=0.15)  # an effect of ~0.2 on logits ~1, as the other cases
    pm.unload()
    peft_model = PeftModel.from_pretrained(model, fused).eval()
    want = _torch_logits(peft_model, IDS)
    peft_model.unload()
    per = tmp_path / "per"
    r = cli("remap", fused, "--experts", "per-expert", "--out", per)
    assert r.exit_code == 0, r.output
    ours = tmp_path / "ours.gguf"
    fmt.from_peft(per, ours, base=str(base_dir), outtype="f32")
    assert any("_exps.weight.lora_a" in n for n in read_header(ours).tensors)
    assert codes_of(verify_gguf(ours, base_gguf)) == []
    drive(llama["python"], "logits", base_gguf, "-", ",".join(map(str, IDS)), tmp_path / "b.npy")
    drive(llama["python"], "logits", base_gguf, ours, ",".join(map(str, IDS)), tmp_path / "l.npy")
    got_base, got = np.load(tmp_path / "b.npy"), np.load(tmp_path / "l.npy")
    effect = np.abs(want - want_base).max()
    assert effect > 100 * TOL, f"the adapter moves the logits by only {effect}"
    assert np.abs(got_base - want_base).max() <= TOL
    err = np.abs(got - want).max()
    assert err <= TOL, f"llama.cpp + our expert LoRA differs from PEFT by {err} (adapter effect {effect})"

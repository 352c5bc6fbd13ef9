"""`adapterdoc merge` on the command line: exit codes, JSON, refusals, partial adapters, crash safety."""

# ruff: noqa: F811  (pytest fixtures imported from test_merge_helpers are shadowed by parameters)

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import torch
from test_merge_helpers import lora_kwargs, save_adapter, saved_base, tree_digest  # noqa: F401

from adapterdoc.merge import merge
from adapterdoc.ml.tiny import tiny_config
from adapterdoc.st.atomic import OUTPUT_MARKER, TEMP_PREFIX


def _adapter(tmp_path, tiny_model, layout="ministral3_text", name="adapter", **kw):
    return save_adapter(tiny_model(layout), str(tmp_path / name), **(kw or lora_kwargs(layout, r=2)))


def test_json_contract(tmp_path, tiny_model, saved_base, cli):
    base = saved_base("ministral3_text")
    adapter = _adapter(tmp_path, tiny_model)
    res = cli("merge", adapter, "--base", base, "--out", tmp_path / "out", "--json")
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["ok"] is True and data["findings"] == []
    assert data["out"] == str(tmp_path / "out") and data["unused"] == []
    assert len(data["applied"]) == 4 * 7 and data["merged_tensors"] == 28
    assert sorted(os.listdir(tmp_path / "out")) == [
        OUTPUT_MARKER,
        "config.json",
        "generation_config.json",
        "model.safetensors",
    ]
    human = cli("merge", adapter, "--base", base, "--out", tmp_path / "out2")
    assert human.exit_code == 0 and "  applied: 28 modules" in human.stdout.splitlines()


def test_partially_matching_adapter_reports_unused_and_exits_1(tmp_path, saved_base, cli):
    """An adapter trained on a 6-layer sibling: layers 4 and 5 match nothing in the 4-layer base."""
    import transformers as tf

    cfg = tiny_config("ministral3_text")
    cfg.num_hidden_layers = 6
    deeper = tf.Ministral3ForCausalLM._from_config(cfg)
    adapter = save_adapter(deeper, str(tmp_path / "adapter"), target_modules=["q_proj", "v_proj"], r=2)
    base = saved_base("ministral3_text")
    before = tree_digest(base)
    res = cli("merge", adapter, "--base", base, "--out", tmp_path / "out", "--json")
    assert res.exit_code == 1, res.stderr
    data = json.loads(res.stdout)
    assert data["ok"] is False and data["out"] is None
    assert sorted(data["unused"]) == sorted(
        f"model.layers.{i}.self_attn.{p}" for i in (4, 5) for p in ("q_proj", "v_proj")
    )
    assert len(data["applied"]) == 8
    assert {f["code"] for f in data["findings"]} == {"AD501"}
    assert all(f["severity"] == "error" for f in data["findings"])
    assert not os.path.exists(tmp_path / "out")
    assert not [n for n in os.listdir(tmp_path) if n.startswith(TEMP_PREFIX)]
    assert tree_digest(base) == before


def test_text_adapter_on_a_vl_base_points_at_remap(tmp_path, tiny_model, saved_base):
    adapter = _adapter(tmp_path, tiny_model, "qwen3_5_text", target_modules=["q_proj"], r=2)
    report = merge(adapter, saved_base("qwen3_5_vl"), tmp_path / "out")
    assert not report.ok and report.out is None and report.applied == []
    assert report.unused == ["model.layers.3.self_attn.q_proj"]
    assert f"adapterdoc remap {adapter} --to qwen3_5_vl" in (report.findings[0].hint or "")


def test_refuses_non_empty_out_without_force(tmp_path, tiny_model, saved_base, cli):
    base = saved_base("ministral3_text")
    adapter = _adapter(tmp_path, tiny_model, target_modules=["q_proj"], r=2)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    res = cli("merge", adapter, "--base", base, "--out", out)
    assert res.exit_code == 3
    assert res.stderr.startswith("adapterdoc: error: ") and res.stderr.count("\n") == 1
    assert "not empty" in res.stderr and (out / "keep.txt").exists()
    # --force replaces only a previous merge output, never a folder of the user's
    res = cli("merge", adapter, "--base", base, "--out", out, "--force", "--json")
    assert res.exit_code == 3 and "did not write" in res.stderr and "keep.txt" in res.stderr
    assert sorted(os.listdir(out)) == ["keep.txt"]
    merged = tmp_path / "merged"
    assert cli("merge", adapter, "--base", base, "--out", merged).exit_code == 0
    (merged / "extra.txt").write_text("x")
    res = cli("merge", adapter, "--base", base, "--out", merged, "--force", "--json")
    assert res.exit_code == 0, res.stderr
    assert not (merged / "extra.txt").exists() and (merged / "model.safetensors").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli("merge", adapter, "--base", base, "--out", empty).exit_code == 0


def test_never_writes_into_the_base_or_adapter(tmp_path, tiny_model, saved_base, cli):
    base = saved_base("ministral3_text")
    adapter = _adapter(tmp_path, tiny_model, target_modules=["q_proj"], r=2)
    before = tree_digest(base)
    for out in (base, os.path.join(base, "merged"), adapter, os.path.dirname(base)):
        res = cli("merge", adapter, "--base", base, "--out", out, "--force")
        assert res.exit_code == 3, out
        assert "overlaps" in res.stderr
    assert tree_digest(base) == before


def test_unusable_inputs_exit_3(tmp_path, tiny_model, saved_base, cli):
    base = saved_base("ministral3_text")
    adapter = _adapter(tmp_path, tiny_model, target_modules=["q_proj"], r=2)
    bare = os.path.join(adapter, "adapter_model.safetensors")
    res = cli("merge", bare, "--base", base, "--out", tmp_path / "o1")
    assert res.exit_code == 3 and "adapter_config.json" in res.stderr
    res = cli("merge", adapter, "--base", adapter, "--out", tmp_path / "o2")
    assert res.exit_code == 3 and "is an adapter" in res.stderr
    no_cfg = tmp_path / "no_cfg"
    no_cfg.mkdir()
    with open(os.path.join(base, "model.safetensors"), "rb") as src:
        (no_cfg / "model.safetensors").write_bytes(src.read())
    res = cli("merge", adapter, "--base", no_cfg, "--out", tmp_path / "o3")
    assert res.exit_code == 3 and "config.json" in res.stderr
    assert cli("merge", adapter, "--base", base, "--out", tmp_path / "o4", "--dtype", "int8").exit_code == 2


def test_non_finite_merge_writes_nothing(tmp_path, tiny_model, saved_base):
    from safetensors.torch import load_file, save_file

    adapter = _adapter(tmp_path, tiny_model, target_modules=["q_proj"], r=2)
    path = os.path.join(adapter, "adapter_model.safetensors")
    tensors = load_file(path)
    key = "base_model.model.model.layers.2.self_attn.q_proj.lora_B.weight"
    tensors[key][0, 0] = float("inf")
    save_file(tensors, path, metadata={"format": "pt"})
    report = merge(adapter, saved_base("ministral3_text"), tmp_path / "out")
    assert [f.code for f in report.findings] == ["AD506"] and report.out is None
    assert not os.path.exists(tmp_path / "out")
    assert not [n for n in os.listdir(tmp_path) if n.startswith(TEMP_PREFIX)]


def test_conv_lora_is_refused_not_skipped(tmp_path, tiny_model, saved_base):
    adapter = _adapter(tmp_path, tiny_model, "qwen3_5_vl", target_modules=["patch_embed.proj", "q_proj"], r=2)
    report = merge(adapter, saved_base("qwen3_5_vl"), tmp_path / "out")
    assert [f.code for f in report.findings] == ["AD503"]
    assert "Conv3d" in report.findings[0].message and report.out is None


def test_killed_merge_leaves_no_output_and_the_base_intact(tmp_path, tiny_model, saved_base):
    base = saved_base("qwen3_5_moe_vl", None, "100KB")
    adapter = _adapter(tmp_path, tiny_model, "qwen3_5_moe_vl", **lora_kwargs("qwen3_5_moe_vl", r=2))
    before = tree_digest(base)
    parent = tmp_path / "parent"
    parent.mkdir()
    env = {**os.environ, "ADAPTERDOC_SLOW_WRITES": "0.5"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "adapterdoc", "merge", adapter, "--base", base, "--out", str(parent / "out")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline:
            temps = [n for n in os.listdir(parent) if n.startswith(TEMP_PREFIX)]
            if temps and any(f.endswith(".safetensors") for f in os.listdir(parent / temps[0])):
                break
            assert proc.poll() is None, "merge finished before it could be interrupted"
            time.sleep(0.05)
        else:
            raise AssertionError("no temp folder appeared")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not os.path.exists(parent / "out")
    assert [n for n in os.listdir(parent) if not n.startswith(TEMP_PREFIX)] == []
    assert tree_digest(base) == before


def test_output_files_are_valid_safetensors(tmp_path, tiny_model, saved_base):
    """Headers are 8-byte aligned, keep `format: pt`, and the reference reader loads every tensor."""
    from safetensors import safe_open

    from adapterdoc.st.header import read_header

    base = saved_base("qwen3_5_moe_vl", None, "100KB")
    adapter = _adapter(tmp_path, tiny_model, "qwen3_5_moe_vl", **lora_kwargs("qwen3_5_moe_vl", r=2))
    report = merge(adapter, base, tmp_path / "out", dtype="float16")
    for f in sorted(os.listdir(report.out)):
        if f.endswith(".safetensors"):
            h = read_header(os.path.join(report.out, f))
            assert h.data_start % 8 == 0 and h.metadata == {"format": "pt"}
            assert {t.dtype for t in h.tensors.values()} == {"F16"}
            with safe_open(os.path.join(report.out, f), "pt") as g:
                for k in g.keys():  # noqa: SIM118
                    assert g.get_tensor(k).dtype == torch.float16


def test_bin_adapter_merges_like_safetensors(tmp_path, tiny_model, saved_base):
    from safetensors.torch import load_file

    from adapterdoc.st.header import read_header

    adapter = _adapter(tmp_path, tiny_model, target_modules=["q_proj", "embed_tokens"], r=2)
    base = saved_base("ministral3_text")
    ref = merge(adapter, base, tmp_path / "from_st")
    st_path = os.path.join(adapter, "adapter_model.safetensors")
    torch.save(load_file(st_path), os.path.join(adapter, "adapter_model.bin"))
    os.remove(st_path)
    got = merge(adapter, base, tmp_path / "from_bin")
    assert got.ok and got.applied == ref.applied
    a = read_header(os.path.join(ref.out, "model.safetensors"))
    b = read_header(os.path.join(got.out, "model.safetensors"))
    assert a.tensors == b.tensors
    with open(a.path, "rb") as fa, open(b.path, "rb") as fb:
        assert fa.read() == fb.read()


def test_text_report_collapses_unused_modules(monkeypatch):
    from adapterdoc.merge import MergeReport
    from adapterdoc.report.findings import make
    from adapterdoc.report.merge_text import render_merge

    monkeypatch.setenv("NO_COLOR", "1")
    unused = [f"model.layers.{i}.self_attn.q_proj" for i in range(40)]
    report = MergeReport(
        adapter="ad",
        base="base",
        out=None,
        dtype="auto",
        applied=["model.layers.0.mlp.down_proj"],
        unused=unused,
        findings=[
            make("AD501", f"`{m}` is not a module", key=m, hint="adapterdoc remap ADAPTER --to X")
            for m in unused
        ],
    )
    text = render_merge(report, width=80)
    assert "nothing written" in text and "  unused: 40 modules" in text.splitlines()
    assert [line for line in text.splitlines() if "AD501" in line] == [
        "error AD501 ×40 `model.layers.0.self_attn.q_proj` is not a module"
    ]
    assert "    and 39 more like it; --json lists them" in text.splitlines()
    assert text.count("adapterdoc remap ADAPTER --to X") == 1
    data = report.to_dict()
    assert data["ok"] is False and data["out"] is None and len(data["findings"]) == 40
    assert set(data) >= {"ok", "findings", "applied", "unused", "out"}


def test_lora_variants_with_their_own_merge_rule_are_refused(tmp_path, tiny_model, saved_base):
    adapter = _adapter(tmp_path, tiny_model, target_modules=["q_proj"], r=2, alora_invocation_tokens=[5, 6])
    report = merge(adapter, saved_base("ministral3_text"), tmp_path / "out")
    assert {f.code for f in report.findings} == {"AD503"} and report.out is None
    assert "ALoraLinearVariant" in report.findings[0].message


def test_keys_peft_loads_are_merged_as_peft_reads_them(tmp_path, tiny_model, saved_base):
    """QA: keys without `base_model.model.`, or with the `default` adapter name, load in PEFT; merge must agree."""
    from adapterdoc.remap import remap

    adapter = _adapter(tmp_path, tiny_model, "qwen3_5_text", target_modules=["q_proj"], r=2)
    ref = merge(adapter, saved_base("qwen3_5_text"), tmp_path / "ref")
    assert ref.ok
    for name, rule in (
        ("noprefix", r"^base_model\.model\.=>"),
        ("named", r"\.lora_([AB])\.weight$=>.lora_\1.default.weight"),
    ):
        variant = tmp_path / name
        remap(adapter, rules=[rule], out=variant)
        got = merge(variant, saved_base("qwen3_5_text"), tmp_path / f"out-{name}")
        assert got.ok and got.applied == ref.applied and not got.unused
        for f in os.listdir(tmp_path / "ref"):
            if f.endswith(".safetensors"):
                assert (tmp_path / "ref" / f).read_bytes() == (tmp_path / f"out-{name}" / f).read_bytes()

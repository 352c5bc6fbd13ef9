"""`adapterdoc remap` on real safetensors files (written by the safetensors library, no torch): keys, bytes,
strategies, config consistency, refusals, symlinks, crash safety and the CLI contract."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.numpy import save_file

from adapterdoc.remap import BIN_BACKUP, parse_rule, remap
from adapterdoc.st import rewrite
from adapterdoc.st.header import read_header

W = "base_model.model."
VL_MODULES = [
    f"model.language_model.layers.{i}.{m}"
    for i in range(2)
    for m in ("self_attn.q_proj", "self_attn.v_proj", "linear_attn.in_proj_qkv", "mlp.down_proj")
]


def lora_tensors(modules: list[str], r: int = 2, dim: int = 8, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for m in modules:
        out[f"{W}{m}.lora_A.weight"] = rng.standard_normal((r, dim)).astype(np.float32)
        out[f"{W}{m}.lora_B.weight"] = rng.standard_normal((dim, r)).astype(np.float32)
    return out


def peft_config(**kw: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "peft_type": "LORA",
        "r": 2,
        "lora_alpha": 4,
        "target_modules": ["q_proj", "v_proj", "in_proj_qkv", "down_proj"],
        "exclude_modules": None,
        "modules_to_save": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "some_future_field": {"kept": [1, 2.5, None]},
        "base_model_name_or_path": "Qwen/Qwen3.5-0.8B",
        "task_type": "CAUSAL_LM",
    }
    cfg.update(kw)
    return dict(sorted(cfg.items()))


def make_adapter(
    folder: Path,
    modules: list[str] | None = None,
    *,
    tensors: dict[str, np.ndarray] | None = None,
    config: dict[str, Any] | None = None,
    readme: bool = True,
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_file(
        tensors if tensors is not None else lora_tensors(modules or VL_MODULES),
        folder / "adapter_model.safetensors",
        metadata={"format": "pt"},
    )
    # PEFT writes json.dumps(indent=2, sort_keys=True) without a final newline
    (folder / "adapter_config.json").write_text(json.dumps(config or peft_config(), indent=2, sort_keys=True))
    if readme:
        (folder / "README.md").write_text("---\nlibrary_name: peft\n---\n# my adapter\n")
    return folder


def data_hash(path: Path) -> str:
    h = read_header(path)
    with open(path, "rb") as f:
        f.seek(h.data_start)
        return hashlib.sha256(f.read()).hexdigest()


def file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree_state(folder: Path) -> dict[str, tuple[str, int, bool]]:
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() or p.is_symlink():
            out[str(p.relative_to(folder))] = (
                file_hash(p) if p.exists() else "",
                p.lstat().st_mode,
                p.is_symlink(),
            )
    return out


def tensors_of(path: Path) -> dict[str, np.ndarray]:
    with safe_open(str(path), "np") as f:
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118


# ------------------------------------------------------------------------------------------ --vl, in place


def test_vl_strips_the_infix_in_place_and_keeps_every_data_byte(tmp_path: Path) -> None:
    ad = make_adapter(tmp_path / "a")
    wpath = ad / "adapter_model.safetensors"
    before = read_header(wpath)
    old_tensors = tensors_of(wpath)
    digest, ino = data_hash(wpath), wpath.stat().st_ino

    report = remap(ad, vl=True)

    assert report.strategy == "in-place" and report.renamed == 16
    after = read_header(wpath)
    assert after.header_len == before.header_len and after.file_size == before.file_size
    assert after.metadata == {"format": "pt"}
    assert data_hash(wpath) == digest and wpath.stat().st_ino == ino
    new_tensors = tensors_of(wpath)  # the reference reader accepts the padded header
    assert set(new_tensors) == {k.replace(".language_model.", ".") for k in old_tensors}
    for old, arr in old_tensors.items():
        np.testing.assert_array_equal(new_tensors[report.mapping[old]], arr)
    assert report.source_layout == "qwen3_5_vl" and report.target_layout == "qwen3_5_text"


def test_vl_is_idempotent_and_touches_nothing_the_second_time(tmp_path: Path, cli: Any) -> None:
    ad = make_adapter(tmp_path / "a")
    assert cli("remap", ad, "--vl").exit_code == 0
    state = tree_state(ad)
    mtime = (ad / "adapter_model.safetensors").stat().st_mtime_ns
    res = cli("remap", ad, "--vl", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["ok"] is True and out["strategy"] == "none" and out["renamed"] == 0 and out["mapping"] == {}
    assert tree_state(ad) == state
    assert (ad / "adapter_model.safetensors").stat().st_mtime_ns == mtime


def test_round_trip_vl_text_vl_is_byte_identical(tmp_path: Path, cli: Any) -> None:
    ad = make_adapter(
        tmp_path / "a",
        config=peft_config(
            target_modules=r"model\.language_model\.layers\.\d+\.(self_attn\.(q|v)_proj|linear_attn\.in_proj_qkv|mlp\.down_proj)",
            exclude_modules=r"(^|.*\.)(visual|mtp)(\..*|$)",
        ),
    )
    state = tree_state(ad)
    r1 = cli("remap", ad, "--vl", "--json")
    assert r1.exit_code == 0 and json.loads(r1.stdout)["strategy"] == "in-place"
    r2 = cli("remap", ad, "--to", "qwen3_5_vl", "--json")
    assert r2.exit_code == 0, r2.output
    assert json.loads(r2.stdout)["strategy"] == "in-place"  # the original length is still there
    assert tree_state(ad) == state  # weights AND config byte for byte


def test_round_trip_text_vl_text_keeps_keys_and_data(tmp_path: Path) -> None:
    text_modules = [m.replace("language_model.", "") for m in VL_MODULES]
    ad = make_adapter(tmp_path / "a", text_modules)
    wpath = ad / "adapter_model.safetensors"
    original, digest = read_header(wpath), data_hash(wpath)
    grown = remap(ad, to="qwen3_5_vl")
    assert grown.strategy == "copy"  # 16 keys × 15 bytes more: does not fit
    h = read_header(wpath)
    assert (8 + h.header_len) % 8 == 0 and data_hash(wpath) == digest
    back = remap(ad, to="qwen3_5_text")
    assert back.strategy == "in-place"
    h2 = read_header(wpath)
    assert h2.tensors == original.tensors and h2.metadata == original.metadata and data_hash(wpath) == digest
    # the header keeps the larger length (padding) so the file is not byte-identical, only equivalent
    assert h2.header_len == h.header_len


def test_dry_run_writes_nothing_and_reports_the_plan(tmp_path: Path, cli: Any) -> None:
    ad = make_adapter(tmp_path / "a")
    state = tree_state(ad)
    res = cli("remap", ad, "--vl", "--dry-run", "--json")
    assert res.exit_code == 0
    out = json.loads(res.stdout)
    assert out["dry_run"] is True and out["strategy"] == "in-place" and out["renamed"] == 16
    assert out["mapping"][f"{W}model.language_model.layers.0.self_attn.q_proj.lora_A.weight"] == (
        f"{W}model.layers.0.self_attn.q_proj.lora_A.weight"
    )
    assert tree_state(ad) == state
    human = cli("remap", ad, "--to", "qwen3_5_text", "--dry-run")
    assert human.exit_code == 0 and "  would rename 16 keys (in-place)" in human.stdout.splitlines()
    assert tree_state(ad) == state


def test_json_is_one_object_with_the_contract_fields(tmp_path: Path, cli: Any) -> None:
    ad = make_adapter(tmp_path / "a")
    res = cli("remap", ad, "--vl", "--json")
    out = json.loads(res.stdout)  # the whole stdout is one object
    for key in ("ok", "findings", "renamed", "strategy", "mapping"):
        assert key in out
    assert out["renamed"] == len(out["mapping"]) == 16
    assert res.stderr == ""


# -------------------------------------------------------------------------------------------- refusals


def refused(cli: Any, args: list[Any], folder: Path, needle: str) -> None:
    state = tree_state(folder)
    res = cli("remap", *args)
    assert res.exit_code == 3, res.output
    assert res.stderr.startswith("adapterdoc: error: ") and needle in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    assert tree_state(folder) == state


def test_refuses_a_double_infix(tmp_path: Path, cli: Any) -> None:
    mods = [*VL_MODULES, "model.language_model.layers.0.language_model.q_proj"]
    ad = make_adapter(tmp_path / "a", mods)
    refused(cli, [ad, "--vl"], ad, "would still contain `.language_model.`")


def test_refuses_a_collision(tmp_path: Path, cli: Any) -> None:
    mods = [*VL_MODULES, "model.layers.0.self_attn.q_proj"]  # the stripped name already exists
    ad = make_adapter(tmp_path / "a", mods)
    refused(cli, [ad, "--vl"], ad, "collision")
    refused(cli, [ad, "--rule", r"layers\.\d+=>layers.0"], ad, "collision")


def test_refuses_an_adapter_without_lora_keys(tmp_path: Path, cli: Any) -> None:
    t = {f"{W}model.language_model.embed_tokens.weight": np.zeros((4, 4), np.float32)}
    ad = make_adapter(tmp_path / "a", tensors=t)
    refused(cli, [ad, "--vl"], ad, "no LoRA keys")


def test_refuses_a_read_only_file(tmp_path: Path, cli: Any) -> None:
    ad = make_adapter(tmp_path / "a")
    w = ad / "adapter_model.safetensors"
    w.chmod(0o444)
    refused(cli, [ad, "--vl"], ad, "read-only")
    refused(cli, [ad, "--to", "qwen3_5_text"], ad, "read-only")


def test_refuses_a_read_only_config(tmp_path: Path, cli: Any) -> None:
    cfg = peft_config(target_modules=r".*\.language_model\..*\.(q_proj|v_proj|in_proj_qkv|down_proj)")
    ad = make_adapter(tmp_path / "a", config=cfg)
    (ad / "adapter_config.json").chmod(0o444)
    refused(cli, [ad, "--vl"], ad, "read-only")


def test_refuses_a_missing_input(tmp_path: Path, cli: Any) -> None:
    res = cli("remap", tmp_path / "nope", "--vl")
    assert res.exit_code == 3 and "adapterdoc: error:" in res.stderr
    ad = make_adapter(tmp_path / "a")
    (ad / "adapter_model.safetensors").unlink()
    refused(cli, [ad, "--vl"], ad, "adapter_model")


def test_refuses_a_non_empty_out_folder(tmp_path: Path, cli: Any) -> None:
    ad = make_adapter(tmp_path / "a")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    refused(cli, [ad, "--vl", "--out", out], tmp_path, "not empty")


def test_layout_moves_need_a_known_source(tmp_path: Path, cli: Any) -> None:
    gpt2 = make_adapter(tmp_path / "g", ["transformer.h.0.attn.c_attn"])
    refused(cli, [gpt2, "--to", "qwen3_5_text"], gpt2, "--from")
    # a pre-4.52 Qwen2.5-VL adapter without tower LoRA looks like any text decoder: say where it comes from
    legacy = make_adapter(
        tmp_path / "l", ["model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.v_proj"]
    )
    # (its config names Qwen/Qwen3.5-0.8B, which settles "a plain decoder" as qwen3_5_text)
    refused(cli, [legacy, "--to", "qwen_vl"], legacy, "no move from qwen3_5_text to qwen_vl")
    res = cli("remap", legacy, "--to", "qwen_vl", "--from", "qwen_vl_legacy", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["renamed"] == 4 and out["source_layout"] == "qwen_vl_legacy"
    assert set(read_header(legacy / "adapter_model.safetensors").tensors) == {
        f"{W}model.language_model.layers.0.self_attn.q_proj.lora_A.weight",
        f"{W}model.language_model.layers.0.self_attn.q_proj.lora_B.weight",
        f"{W}model.language_model.layers.1.self_attn.v_proj.lora_A.weight",
        f"{W}model.language_model.layers.1.self_attn.v_proj.lora_B.weight",
    }
    bert = make_adapter(tmp_path / "b", ["model.layers.0.attn.Wqkv", "model.layers.0.mlp.Wo"])
    refused(cli, [bert, "--to", "qwen3_5_vl"], bert, "no move from modernbert_mlm to qwen3_5_vl")


def test_an_ambiguous_layout_is_settled_by_the_target(tmp_path: Path, cli: Any) -> None:
    # decoder-only keys under model.language_model: Mistral3 or Qwen-VL (no base model name to tell)
    mods = [f"model.language_model.layers.{i}.self_attn.q_proj" for i in range(2)]
    ad = make_adapter(tmp_path / "a", mods, config=peft_config(base_model_name_or_path=None))
    res = cli("remap", ad, "--to", "ministral3_text", "--json", "--dry-run")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["source_layout"] == "mistral3_vl" and any("equally" in n for n in out["notes"])
    res = cli("remap", ad, "--to", "qwen_vl_legacy", "--json", "--dry-run")
    assert res.exit_code == 0 and json.loads(res.stdout)["source_layout"] == "qwen_vl"


def test_an_ambiguity_that_moves_differently_is_refused() -> None:
    from adapterdoc.errors import RefusedError
    from adapterdoc.remap.moves import settle_ambiguity as _settle_ambiguity

    same = ["model.language_model.layers.0.self_attn.q_proj"]
    notes: list[str] = []
    assert (
        _settle_ambiguity("f", same, ("qwen3_omni", "qwen3_omni_thinker"), "qwen3_moe_text", notes)
        == "qwen3_omni"
    )
    assert "move the same way" in notes[0]
    differ = ["thinker.model.language_model.layers.0.self_attn.q_proj"]
    with pytest.raises(RefusedError, match="differently"):
        _settle_ambiguity("f", differ, ("qwen3_omni", "qwen3_omni_thinker"), "qwen3_moe_text", [])


def test_usage_errors_exit_2(tmp_path: Path, cli: Any) -> None:
    ad = make_adapter(tmp_path / "a")
    state = tree_state(ad)
    for args in (
        [ad],
        [ad, "--vl", "--to", "qwen3_5_text"],
        [ad, "--vl", "--rule", "a=>b"],
        [ad, "--rule", "no-arrow"],
        [ad, "--rule", "(=>x"],
        [ad, "--rule", r"a=>\2"],
        [ad, "--vl", "--from", "qwen3_5_vl"],
        [ad, "--to", "no_such_layout"],
    ):
        res = cli("remap", *args)
        assert res.exit_code == 2, (args, res.output)
    assert tree_state(ad) == state


def test_parse_rule() -> None:
    assert parse_rule(r"^base_model\.model\.=>").apply("base_model.model.x") == "x"
    with pytest.raises(ValueError):
        parse_rule("=>x")


# ------------------------------------------------------------------------------------------------ --rule


def test_rules_apply_in_order_to_the_full_key(tmp_path: Path) -> None:
    # an in-memory state dict saved raw: adapter name in the keys and no wrapper
    t = {
        f"model.layers.{i}.self_attn.q_proj.lora_{ab}.default.weight": np.ones((2, 2), np.float32)
        for i in range(2)
        for ab in "AB"
    }
    ad = make_adapter(tmp_path / "a", tensors=t, config=peft_config(target_modules=["q_proj"]))
    rep = remap(ad, rules=[r"\.(lora_[AB])\.default\.=>.\1.", r"^(?!base_model\.model\.)=>base_model.model."])
    names = set(read_header(ad / "adapter_model.safetensors").tensors)
    assert names == {
        f"{W}model.layers.{i}.self_attn.q_proj.lora_{ab}.weight" for i in range(2) for ab in "AB"
    }
    assert rep.renamed == 4 and rep.strategy == "copy"  # the header grew


# ------------------------------------------------------------------------------------------------ config


def test_config_fields_with_module_paths_follow_the_keys(tmp_path: Path) -> None:
    cfg = peft_config(
        target_modules=r".*\.language_model\..*\.(q_proj|v_proj|in_proj_qkv|down_proj)",
        exclude_modules=r"(^|.*\.)(visual|mtp)(\..*|$)",
        rank_pattern={"model.language_model.layers.0.self_attn.q_proj": 2, "down_proj": 2},
        alpha_pattern={"model.language_model.layers.1.mlp.down_proj": 8},
        modules_to_save=["lm_head", "model.language_model.norm"],
    )
    t = lora_tensors(VL_MODULES)
    t[f"{W}model.language_model.norm.weight"] = np.ones((8,), np.float32)
    t[f"{W}lm_head.weight"] = np.ones((8, 8), np.float32)
    ad = make_adapter(tmp_path / "a", tensors=t, config=cfg)
    raw_before = (ad / "adapter_config.json").read_text()
    rep = remap(ad, vl=True)
    text = (ad / "adapter_config.json").read_text()
    new = json.loads(text)
    assert list(new) == list(cfg)  # field order kept, nothing added or dropped
    assert new["some_future_field"] == {"kept": [1, 2.5, None]}
    assert new["target_modules"] == r".*\..*\.(q_proj|v_proj|in_proj_qkv|down_proj)"
    assert new["exclude_modules"] == cfg["exclude_modules"]
    assert new["rank_pattern"] == {"model.layers.0.self_attn.q_proj": 2, "down_proj": 2}
    assert new["alpha_pattern"] == {"model.layers.1.mlp.down_proj": 8}
    assert new["modules_to_save"] == ["lm_head", "model.norm"]
    assert {c.field for c in rep.config_changes} == {
        "target_modules",
        "rank_pattern",
        "alpha_pattern",
        "modules_to_save",
    }
    # written the way PEFT writes it: indent 2, no final newline
    assert text == json.dumps(new, indent=2) and raw_before.count("\n") == text.count("\n")


def test_leaf_lists_stay_and_full_path_lists_move(tmp_path: Path) -> None:
    full = [*VL_MODULES]
    ad = make_adapter(tmp_path / "a", config=peft_config(target_modules=full))
    remap(ad, vl=True)
    assert json.loads((ad / "adapter_config.json").read_text())["target_modules"] == [
        m.replace("language_model.", "") for m in full
    ]
    ad2 = make_adapter(tmp_path / "b")
    before = (ad2 / "adapter_config.json").read_bytes()
    rep = remap(ad2, vl=True)
    assert rep.config_changes == [] and (ad2 / "adapter_config.json").read_bytes() == before


def test_a_regex_no_textual_rule_fixes_becomes_the_exact_modules(tmp_path: Path) -> None:
    # `.*language_model\.layers.*` has no dot before language_model: no rule rewrites it textually and keeps
    # the same selection, so the config lists the remapped modules explicitly
    rx = r"model\.language_model\.layers\.[01]\.self_attn\.(q|v)_proj|.*language_model\.layers\.\d\.(linear_attn|mlp)\..*"
    ad = make_adapter(tmp_path / "a", config=peft_config(target_modules=rx))
    rep = remap(ad, vl=True)
    new = json.loads((ad / "adapter_config.json").read_text())["target_modules"]
    import re

    targets = [m.replace("language_model.", "") for m in VL_MODULES]
    assert all(re.fullmatch(new, m) for m in targets)
    assert not re.fullmatch(new, "model.layers.0.mlp.up_proj")
    assert rep.config_changes[0].how in ("explicit", "literal")


def test_moving_onto_a_layout_with_towers_excludes_them(tmp_path: Path) -> None:
    text_modules = [m.replace("language_model.", "") for m in VL_MODULES if "linear_attn" not in m]
    ad = make_adapter(
        tmp_path / "a", text_modules, config=peft_config(target_modules=["q_proj", "v_proj", "down_proj"])
    )
    rep = remap(ad, to="mistral3_vl", source="ministral3_text")
    new = json.loads((ad / "adapter_config.json").read_text())
    assert new["exclude_modules"] == r"(^|.*\.)(vision_tower|multi_modal_projector)(\..*|$)"
    assert [c.how for c in rep.config_changes] == ["towers"]


def test_tower_lora_left_behind_is_a_warning(tmp_path: Path, cli: Any) -> None:
    mods = [*VL_MODULES, "model.visual.blocks.0.attn.qkv"]
    ad = make_adapter(tmp_path / "a", mods)
    res = cli("remap", ad, "--vl", "--json")
    assert res.exit_code == 0
    out = json.loads(res.stdout)
    assert [f["code"] for f in out["findings"]] == ["AD202"] and out["findings"][0]["severity"] == "warning"
    assert out["renamed"] == 16


# -------------------------------------------------------------------------------------- --out and links


def test_out_writes_a_complete_folder_and_leaves_the_input(tmp_path: Path, cli: Any) -> None:
    ad = make_adapter(tmp_path / "a")
    (ad / "tokenizer.json").write_text("{}")
    (ad / "checkpoint-10").mkdir()
    state = tree_state(ad)
    out = tmp_path / "empty"
    out.mkdir()  # an empty folder is fine
    res = cli("remap", ad, "--vl", "--out", out, "--json")
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["strategy"] == "copy" and rep["out"] == str(out)
    assert tree_state(ad) == state
    assert sorted(os.listdir(out)) == [
        "README.md",
        "adapter_config.json",
        "adapter_model.safetensors",
        "tokenizer.json",
    ]
    assert all(".language_model." not in k for k in read_header(out / "adapter_model.safetensors").tensors)
    assert data_hash(out / "adapter_model.safetensors") == data_hash(ad / "adapter_model.safetensors")
    # a new file gets a fresh header, padded the way safetensors pads (minimal, 8-aligned), not the old length
    fresh = read_header(out / "adapter_model.safetensors")
    raw = (out / "adapter_model.safetensors").read_bytes()[8 : 8 + fresh.header_len]
    assert fresh.data_start % 8 == 0 and len(raw) - len(raw.rstrip(b" ")) < 8
    remap(ad, vl=True)  # in place keeps the old length: same keys and data, longer padding
    assert read_header(ad / "adapter_model.safetensors").tensors.keys() == fresh.tensors.keys()
    assert any("checkpoint-10" in n for n in rep["notes"])
    assert not [n for n in os.listdir(tmp_path) if rewrite.is_temp_leftover(n)]


def make_cache(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A Hugging Face cache with one blob shared by two revisions (snapshots hold relative symlinks)."""
    repo = tmp_path / "hub" / "models--org--adapter"
    src = make_adapter(tmp_path / "src")
    blobs = repo / "blobs"
    blobs.mkdir(parents=True)
    snaps = []
    for commit in ("a" * 40, "b" * 40):
        snap = repo / "snapshots" / commit
        snap.mkdir(parents=True)
        for name in ("adapter_model.safetensors", "adapter_config.json"):
            data = (src / name).read_bytes()
            blob = blobs / hashlib.sha256(data).hexdigest()
            blob.write_bytes(data)
            (snap / name).symlink_to(os.path.relpath(blob, snap))
        snaps.append(snap)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    return repo, snaps[0], snaps[1]


def test_a_symlinked_cache_blob_is_never_written_through(
    tmp_path: Path, cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants as hub_constants

    repo, snap, other = make_cache(tmp_path)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))  # read at import time
    blobs = {p.name: file_hash(p) for p in (repo / "blobs").iterdir()}
    link = snap / "adapter_model.safetensors"
    res = cli(
        "remap",
        "org/adapter",
        "--vl",
        "--json",
        env={"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"},
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["strategy"] == "copy" and any("symlink" in n for n in out["notes"])
    assert {p.name: file_hash(p) for p in (repo / "blobs").iterdir()} == blobs  # shared blobs untouched
    assert not link.is_symlink() and stat.S_ISREG(link.lstat().st_mode)
    assert all(".language_model." not in k for k in read_header(link).tensors)
    # the other revision still sees the original adapter
    assert (other / "adapter_model.safetensors").is_symlink()
    assert any(".language_model." in k for k in read_header(other / "adapter_model.safetensors").tensors)
    # and a direct path to a snapshot behaves the same
    res2 = cli("remap", other, "--vl")
    assert res2.exit_code == 0 and not (other / "adapter_model.safetensors").is_symlink()
    assert {p.name: file_hash(p) for p in (repo / "blobs").iterdir()} == blobs


def test_a_hard_linked_file_is_copied_not_written_in_place(tmp_path: Path) -> None:
    ad = make_adapter(tmp_path / "a")
    w = ad / "adapter_model.safetensors"
    twin = tmp_path / "twin.safetensors"
    os.link(w, twin)
    before = file_hash(twin)
    rep = remap(ad, vl=True)
    assert rep.strategy == "copy"
    assert file_hash(twin) == before and os.stat(w).st_nlink == 1


def test_a_copy_keeps_the_file_mode(tmp_path: Path) -> None:
    ad = make_adapter(tmp_path / "a", [m.replace("language_model.", "") for m in VL_MODULES])
    w = ad / "adapter_model.safetensors"
    w.chmod(0o640)
    assert remap(ad, to="qwen3_5_vl").strategy == "copy"
    assert stat.S_IMODE(w.stat().st_mode) == 0o640


def test_a_bare_safetensors_file(tmp_path: Path, cli: Any) -> None:
    f = tmp_path / "weights.safetensors"
    save_file(lora_tensors(VL_MODULES), f, metadata={"format": "pt"})
    res = cli("remap", f, "--vl", "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["strategy"] == "in-place"
    assert all(".language_model." not in k for k in read_header(f).tensors)


def test_the_weights_file_path_means_its_adapter_folder(tmp_path: Path) -> None:
    ad = make_adapter(tmp_path / "a", config=peft_config(target_modules=list(VL_MODULES)))
    remap(ad / "adapter_model.safetensors", vl=True)
    assert (
        json.loads((ad / "adapter_config.json").read_text())["target_modules"][0]
        == "model.layers.0.self_attn.q_proj"
    )


def test_bin_backup_name_is_documented() -> None:
    assert BIN_BACKUP == "adapter_model.bin.bak"


# ---------------------------------------------------------------------------------------- large copies


def test_a_large_copy_streams_with_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ad = make_adapter(tmp_path / "a", [m.replace("language_model.", "") for m in VL_MODULES])
    from adapterdoc.commands import remap_cmd

    monkeypatch.setattr(remap_cmd, "PROGRESS_MIN_BYTES", 1)
    monkeypatch.setattr(rewrite, "COPY_CHUNK", 64)  # many chunks through both copy paths
    digest = data_hash(ad / "adapter_model.safetensors")
    seen: list[tuple[str, int, int]] = []

    @contextlib.contextmanager
    def bar(label: str, total: int) -> Iterator[Callable[[int], None]]:
        with remap_cmd.copy_bar(label, total) as advance:
            seen.append((label, total, 0))

            def step(n: int) -> None:
                seen[-1] = (label, total, seen[-1][2] + n)
                advance(n)

            yield step

    assert remap(ad, to="qwen3_5_vl", progress=bar).strategy == "copy"
    assert data_hash(ad / "adapter_model.safetensors") == digest
    assert len(seen) == 1 and seen[0][0] == "adapter_model.safetensors" and seen[0][1] == seen[0][2] > 0


def test_read_write_fallback_copies_the_same_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ad = make_adapter(tmp_path / "a", [m.replace("language_model.", "") for m in VL_MODULES])
    monkeypatch.delattr(os, "copy_file_range", raising=False)
    monkeypatch.setattr(rewrite, "COPY_CHUNK", 100)
    digest = data_hash(ad / "adapter_model.safetensors")
    remap(ad, to="qwen3_5_vl")
    assert data_hash(ad / "adapter_model.safetensors") == digest


# ------------------------------------------------------------------------------------------- crash safety


def _run_and_kill(args: list[str], after: float) -> None:
    env = {**os.environ, "ADAPTERDOC_SLOW_WRITES": "2"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "adapterdoc", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(after)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


@pytest.mark.parametrize("kill_after", [1.0, 3.0])
def test_killed_mid_remap_leaves_a_valid_adapter_and_a_rerun_finishes(
    tmp_path: Path, kill_after: float
) -> None:
    cfg = peft_config(
        target_modules=r"model\.layers\.\d+\.(self_attn\.(q|v)_proj|linear_attn\.in_proj_qkv|mlp\.down_proj)"
    )
    text_modules = [m.replace("language_model.", "") for m in VL_MODULES]
    ad = make_adapter(tmp_path / "a", text_modules, config=cfg)
    ref = make_adapter(tmp_path / "ref", text_modules, config=cfg)
    remap(ref, to="qwen3_5_vl")  # the uninterrupted result
    w = ad / "adapter_model.safetensors"
    old = file_hash(w)
    # config first (slow point before its rename), then the weights copy (slow point before its rename)
    _run_and_kill(["remap", str(ad), "--to", "qwen3_5_vl"], kill_after)
    assert file_hash(w) in (old, file_hash(ref / "adapter_model.safetensors"))
    read_header(w)  # always a valid file
    assert not [n for n in os.listdir(ad) if not rewrite.is_temp_leftover(n) and n not in os.listdir(ref)]
    for n in os.listdir(ad):
        if rewrite.is_temp_leftover(n):
            os.unlink(ad / n)  # what a user may do after a killed run
    rep = remap(ad, to="qwen3_5_vl")
    assert rep.strategy in ("copy", "none")
    assert file_hash(w) == file_hash(ref / "adapter_model.safetensors")
    assert (ad / "adapter_config.json").read_bytes() == (ref / "adapter_config.json").read_bytes()


def test_killed_during_an_in_place_rewrite(tmp_path: Path) -> None:
    ad = make_adapter(tmp_path / "a")
    w = ad / "adapter_model.safetensors"
    old = file_hash(w)
    _run_and_kill(["remap", str(ad), "--vl"], 1.0)  # sleeping just before the header pwrite
    assert file_hash(w) == old
    assert remap(ad, vl=True).strategy == "in-place"


# ------------------------------------------------------------------------------ header text, properties


_seg = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_0123456789é", min_size=1, max_size=6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    paths=st.lists(
        st.lists(_seg, min_size=1, max_size=4), min_size=1, max_size=8, unique_by=lambda p: ".".join(p)
    ),
    infix_at=st.integers(min_value=0, max_value=3),
)
def test_renamed_header_changes_only_the_renamed_keys(
    tmp_path: Path, paths: list[list[str]], infix_at: int
) -> None:
    modules = []
    for p in paths:
        i = min(infix_at, len(p))
        modules.append(".".join([*p[:i], "language_model", *p[i:]]))
    modules = list(dict.fromkeys(modules))
    f = tmp_path / f"p{abs(hash(tuple(modules)))}.safetensors"
    tensors = lora_tensors(modules, dim=3)
    save_file(tensors, f, metadata={"format": "pt"})
    h = read_header(f)
    raw = f.read_bytes()[8 : h.data_start]
    mapping = {k: k.replace(".language_model.", ".", 1) for k in h.tensors}
    if len(set(mapping.values())) != len(mapping):
        return
    body, n = rewrite.renamed_header(raw, mapping)
    assert n == len(mapping) and len(body) <= len(raw.rstrip())
    assert json.loads(body) == {mapping.get(k, k): v for k, v in json.loads(raw).items()}
    back, _ = rewrite.renamed_header(rewrite.padded(body, h.header_len), {v: k for k, v in mapping.items()})
    assert rewrite.padded(back, h.header_len) == raw


def test_key_spans_handle_escapes_and_whitespace() -> None:
    text = ' {\n "__metadata__" : {"format":"pt"},\n "a\\u00e9\\"b" : {"dtype":"F32","shape":[],"data_offsets":[0,4]} }  '
    spans = rewrite.key_spans(text)
    assert [s.name for s in spans] == ["__metadata__", 'aé"b']
    body, n = rewrite.renamed_header(text.encode(), {'aé"b': "x"})
    assert n == 1 and json.loads(body)["x"]["shape"] == []


def test_importing_the_cli_and_remap_does_not_import_torch() -> None:
    code = (
        "import sys, adapterdoc.cli, adapterdoc.remap, adapterdoc.st.rewrite; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_rule_that_breaks_lora_names_is_refused(tmp_path: Path) -> None:
    """`--rule 'weight=>'` would leave keys ending in `.lora_A.`: no loader reads those as LoRA."""
    from click.testing import CliRunner

    from adapterdoc.cli import main

    folder = tmp_path / "a"
    folder.mkdir()
    key = "base_model.model.model.layers.0.self_attn.q_proj"
    save_file(
        {
            f"{key}.lora_A.weight": np.ones((2, 8), np.float32),
            f"{key}.lora_B.weight": np.ones((8, 2), np.float32),
        },
        str(folder / "adapter_model.safetensors"),
        metadata={"format": "pt"},
    )
    (folder / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 2, "target_modules": ["q_proj"]})
    )
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    res = CliRunner().invoke(main, ["remap", str(folder), "--rule", "weight=>"])
    assert res.exit_code == 3 and "no loader reads as LoRA" in res.stderr
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before

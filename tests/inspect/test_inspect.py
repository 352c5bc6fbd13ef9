"""`adapterdoc inspect` on real PEFT adapters of tiny models: layout detection, the LoRA picture, findings,
the JSON shape and exit codes."""

from __future__ import annotations

import json
import math
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from adapterdoc.cli import main
from adapterdoc.inspection import inspect
from adapterdoc.layouts import get_layout

pytestmark = pytest.mark.ml

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402

R, ALPHA = 4, 8

LAYOUT_PAIRS = [
    ("qwen3_5_vl", "qwen3_5_text"),
    ("qwen3_5_moe_vl", "qwen3_5_moe_text"),
    ("mistral3_vl", "ministral3_text"),
    ("modernbert_mlm", "modernbert"),
]
LAYOUTS = [name for pair in LAYOUT_PAIRS for name in pair]


def save_adapter(layout: str, out: Path, *, exclude: bool = True, **overrides: Any) -> Path:
    """A real PEFT adapter of the tiny ``layout`` model, targeting the registry's leaves (and fused experts)."""
    from adapterdoc.ml.tiny import build_tiny

    spec = get_layout(layout)
    cfg: dict[str, Any] = {"r": R, "lora_alpha": ALPHA, "target_modules": list(spec.lora_leaves)}
    if spec.target_parameters:
        cfg["target_parameters"] = list(spec.target_parameters)
    if exclude and spec.exclude_regex:
        cfg["exclude_modules"] = spec.exclude_regex
    cfg.update(overrides)
    model = peft.get_peft_model(build_tiny(layout, seed=0), peft.LoraConfig(**cfg))
    model.save_pretrained(str(out))
    # name the base, as trainers do: Mistral3 and Qwen2.5-VL adapters have the same keys, the name tells them apart
    edit_config(out, base_model_name_or_path=HUB_NAMES.get(layout, f"tiny:{layout}"))
    return out


HUB_NAMES = {
    "mistral3_vl": "mistralai/Ministral-3-8B-Instruct-2512",
    "qwen_vl": "Qwen/Qwen2.5-VL-7B-Instruct",
}


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    out = {name: save_adapter(name, root / name) for name in LAYOUTS}
    out["tower"] = save_adapter("mistral3_vl", root / "tower", exclude=False)
    out["modules_to_save"] = save_adapter("ministral3_text", root / "mts", modules_to_save=["lm_head"])
    out["dora"] = save_adapter("ministral3_text", root / "dora", use_dora=True)
    return out


def run(*args: str) -> Any:
    return CliRunner().invoke(main, ["inspect", *args], env={"NO_COLOR": "1", "ADAPTERDOC_DEBUG": None})


def run_json(path: Path) -> tuple[int, dict[str, Any]]:
    result = run("--json", str(path))
    assert result.exit_code in (0, 1), result.stderr
    return result.exit_code, json.loads(result.stdout)  # the whole of stdout is one object


def codes(report: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for f in report["findings"]:
        out.setdefault(f["code"], []).append(f)
    return out


def copy(adapters: dict[str, Path], name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(adapters[name], tmp_path / name))


def edit_config(path: Path, **changes: Any) -> None:
    cfg_path = path / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(changes)
    cfg_path.write_text(json.dumps(cfg))


# --------------------------------------------------------------------------- layout detection


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_detected(adapters: dict[str, Path], layout: str) -> None:
    code, report = run_json(adapters[layout])
    assert report["layout"]["name"] == layout, report["layout"]
    assert report["layout"]["evidence"]
    assert code == 0 and report["ok"] is True
    assert report["kind"] == "adapter"
    assert report["lora"]["modules"] > 0
    assert not [f for f in report["findings"] if f["severity"] in ("error", "warning")], report["findings"]


@pytest.mark.parametrize(("vl", "text"), LAYOUT_PAIRS)
def test_vl_and_text_forms_differ_only_by_the_prefix(adapters: dict[str, Path], vl: str, text: str) -> None:
    vl_keys = set(load_file(str(adapters[vl] / "adapter_model.safetensors")))
    text_keys = set(load_file(str(adapters[text] / "adapter_model.safetensors")))
    rules = get_layout(vl).remaps[text]
    moved = set()
    for key in vl_keys:
        module = key.removeprefix("base_model.model.")
        for rule in rules:
            module = rule.apply(module)
        moved.add("base_model.model." + module)
    assert moved == text_keys


def test_fused_expert_lora(adapters: dict[str, Path]) -> None:
    _, report = run_json(adapters["qwen3_5_moe_vl"])
    lora = report["lora"]
    assert lora["fused_expert_modules"] == 2 * 4  # gate_up_proj and down_proj in each of 4 layers
    assert sorted(lora["target_parameters"]) == ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"]
    experts = 4
    assert lora["ranks"] == {str(R): lora["modules"] - 8, str(R * experts): 8}  # lora_A rows are r * E
    assert "AD204" not in codes(report) and "AD205" not in codes(report)
    assert any("fused-expert" in e for e in report["layout"]["evidence"])


# --------------------------------------------------------------------------- the LoRA picture and JSON shape


def test_json_shape(adapters: dict[str, Path]) -> None:
    path = adapters["ministral3_text"]
    result = run("--json", str(path))
    assert result.exit_code == 0 and result.stderr == ""
    report = json.loads(result.stdout)
    assert {"ok", "findings", "files", "tensors", "dtypes", "layout", "lora"} <= set(report)
    weights = path / "adapter_model.safetensors"
    tensors = load_file(str(weights))
    (n,) = struct.unpack("<Q", weights.read_bytes()[:8])
    assert report["files"] == [
        {
            "path": str(weights),
            "bytes": weights.stat().st_size,
            "header_bytes": 8 + n,
            "tensors": len(tensors),
        }
    ]
    assert report["tensors"] == len(tensors)
    assert report["dtypes"] == {"F32": len(tensors)}
    assert report["parameters"] == sum(t.numel() for t in tensors.values())
    assert report["metadata"] == {"format": "pt"}
    lora = report["lora"]
    assert lora["modules"] == len(tensors) // 2 == 28
    assert lora["ranks"] == {str(R): 28}
    assert lora["alpha"] == ALPHA and lora["scaling"] == ALPHA / R
    assert lora["use_rslora"] is False and lora["use_dora"] is False
    assert sum(lora["per_leaf"].values()) == 28
    assert set(lora["per_leaf"]) == set(get_layout("ministral3_text").lora_leaves)
    assert set(report["layout"]) >= {"name", "evidence"}


def test_rslora_scaling(adapters: dict[str, Path], tmp_path: Path) -> None:
    path = copy(adapters, "ministral3_text", tmp_path)
    edit_config(path, use_rslora=True)
    _, report = run_json(path)
    assert report["lora"]["use_rslora"] is True
    assert report["lora"]["scaling"] == pytest.approx(ALPHA / math.sqrt(R))


def test_dora(adapters: dict[str, Path]) -> None:
    code, report = run_json(adapters["dora"])
    assert code == 0 and report["lora"]["use_dora"] is True
    assert report["lora"]["modules"] == 28


def test_human_output(adapters: dict[str, Path]) -> None:
    result = run(str(adapters["qwen3_5_moe_vl"]))
    assert result.exit_code == 0 and result.stderr == ""
    assert "qwen3_5_moe_vl" in result.stdout
    quiet = CliRunner().invoke(main, ["--quiet", "inspect", str(adapters["qwen3_5_moe_vl"])])
    assert quiet.exit_code == 0 and quiet.stdout == ""


def test_library_report_matches_cli(adapters: dict[str, Path]) -> None:
    report = inspect(adapters["qwen3_5_vl"])
    _, cli = run_json(adapters["qwen3_5_vl"])
    assert report.to_dict() == cli


# --------------------------------------------------------------------------- findings


def test_tower_lora_is_flagged(adapters: dict[str, Path]) -> None:
    code, report = run_json(adapters["tower"])
    found = codes(report)
    assert "AD202" in found
    assert all(f["severity"] == "warning" for f in found["AD202"])
    assert any("vision_tower" in f["message"] for f in found["AD202"])
    assert code == 0  # a warning, not a failed check
    # the excluded twin has none
    assert "AD202" not in codes(run_json(adapters["mistral3_vl"])[1])


def test_modules_to_save_is_reported(adapters: dict[str, Path]) -> None:
    _, report = run_json(adapters["modules_to_save"])
    found = codes(report)
    assert "AD203" in found
    assert found["AD203"][0]["key"] == "base_model.model.lm_head.weight"
    assert report["lora"]["modules_to_save"] == ["lm_head"]


def test_rank_mismatch_after_editing_r(adapters: dict[str, Path], tmp_path: Path) -> None:
    path = copy(adapters, "ministral3_text", tmp_path)
    edit_config(path, r=2 * R)
    code, report = run_json(path)
    found = codes(report)
    assert len(found["AD204"]) == 28 and all(f["severity"] == "error" for f in found["AD204"])
    assert code == 1 and report["ok"] is False
    # a rank_pattern that says the truth for q_proj only leaves the others wrong
    edit_config(path, rank_pattern={"q_proj": R})
    code, report = run_json(path)
    flagged = {f["key"].rsplit(".", 1)[-1] for f in codes(report)["AD204"]}
    assert code == 1 and "q_proj" not in flagged and len(codes(report)["AD204"]) == 24


def test_lora_a_without_lora_b(adapters: dict[str, Path], tmp_path: Path) -> None:
    path = copy(adapters, "ministral3_text", tmp_path)
    weights = path / "adapter_model.safetensors"
    tensors = load_file(str(weights))
    module = "base_model.model.model.layers.1.mlp.down_proj"
    del tensors[f"{module}.lora_B.weight"]
    save_file(tensors, str(weights), metadata={"format": "pt"})
    code, report = run_json(path)
    found = codes(report)["AD206"]
    assert [f["key"] for f in found] == [module.removeprefix("base_model.model.")]
    assert found[0]["severity"] == "error"
    assert code == 1 and report["ok"] is False
    assert run(str(path)).exit_code == 1  # the human form exits the same way


def test_untargeted_modules_and_mixed_dtypes(adapters: dict[str, Path], tmp_path: Path) -> None:
    path = copy(adapters, "ministral3_text", tmp_path)
    edit_config(path, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    weights = path / "adapter_model.safetensors"
    tensors = load_file(str(weights))
    tensors = {k: (v.to(torch.bfloat16) if ".lora_B." in k else v) for k, v in tensors.items()}
    save_file(tensors, str(weights), metadata={"format": "pt"})
    code, report = run_json(path)
    found = codes(report)
    assert len(found["AD205"]) == 3 * 4  # gate/up/down in 4 layers
    assert "AD101" in found and report["dtypes"] == {"BF16": 28, "F32": 28}
    assert code == 0  # warnings only


def test_not_an_adapter_has_no_lora_block(tmp_path: Path) -> None:
    from adapterdoc.ml.tiny import build_tiny

    model = build_tiny("ministral3_text", seed=0)
    path = tmp_path / "model.safetensors"
    save_file({k: v.clone() for k, v in model.state_dict().items()}, str(path), metadata={"format": "pt"})
    code, report = run_json(path)
    assert code == 0 and report["lora"] is None and report["kind"] == "file"
    # a plain decoder's weights: Ministral3 or a Qwen3.5 text model without Gated DeltaNet — detection says so
    assert report["layout"]["name"] == "ambiguous" and "ministral3_text" in report["layout"]["candidates"]

"""vLLM 0.33.0's own loading code (scripts/vllm_oracle.py, in the environment .ci/oracles/vllm.sh builds) against
``verify --profile vllm`` and ``remap --for vllm``:

- every ``remap --for vllm`` output, for every registry layout vLLM serves (the MoE classes both ways: Qwen3-MoE
  text, Qwen3.5-MoE text and VL, the Omni thinker, from a fused and from a per-expert adapter), loads in vLLM's
  ``_load_adapter`` (``PEFTHelper.validate_legal``, ``LoRAModel.from_local_checkpoint``'s name check,
  ``_validate_moe_lora_format``) and in PEFT with the original's outputs (1e-5 relative, float32);
- on adapters PEFT writes (each ``LoraConfig`` field vLLM reads, each tensor kind PEFT saves) vLLM's verdict equals
  the profile's: the adapter loads exactly when verify reports none of the codes for what vLLM refuses at load.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

from adapterdoc.layouts import LAYOUTS  # noqa: E402
from adapterdoc.ml.tiny import build_tiny  # noqa: E402
from adapterdoc.remap import remap  # noqa: E402

pytestmark = [pytest.mark.oracle, pytest.mark.ml]

ROOT = Path(__file__).resolve().parents[2]
ORACLE = ROOT / "scripts" / "vllm_oracle.py"
IDS = torch.randint(3, 200, (2, 9), generator=torch.Generator().manual_seed(0))
TOL = 1e-5
FUSED = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
LOAD_CODES = {f"AD{n}" for n in (*range(401, 414), 417, 418, 419, 476, 477)}
"""What vLLM refuses when the adapter is loaded (the rest of the profile says what it serves silently wrong)."""


def cli(*args: str) -> tuple[int, str]:
    from click.testing import CliRunner

    from adapterdoc.cli import main

    res = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return res.exit_code, res.stdout


def outputs(model: Any) -> Any:
    with torch.no_grad():
        m = model.get_base_model() if hasattr(model, "get_base_model") else model
        return m(input_ids=IDS).logits.float()


def trained(layout: str, **kw: Any) -> Any:
    pm = peft.get_peft_model(build_tiny(layout), peft.LoraConfig(**kw))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return pm.eval()


def rel(got: Any, want: Any) -> float:
    return float((got - want).abs().max() / want.abs().max())


def spec(layout: str, folder: Path, max_lora_rank: int = 16) -> dict[str, Any]:
    """What the oracle needs of the base: its class, its Linear leaves, its experts and vocabulary."""
    model = build_tiny(layout)
    cfg = model.config
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    leaves = sorted(
        {n.rpartition(".")[2] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
        | {n.rpartition(".")[2] for n, _ in model.named_modules() if n.endswith(".mlp.gate")}
    )
    return {
        "adapter": str(folder),
        "arch": LAYOUTS[layout].model_class,
        "leaves": leaves,
        "num_experts": int(getattr(text, "num_experts", 0) or 0),
        "vocab_size": int(text.vocab_size),
        "max_lora_rank": max_lora_rank,
    }


def vllm(python: Path, specs: list[dict[str, Any]], tmp: Path) -> list[dict[str, Any]]:
    path = tmp / "specs.json"
    path.write_text(json.dumps(specs))
    r = subprocess.run([str(python), str(ORACLE), str(path)], capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def profile_codes(folder: Path, layout: str, *extra: str) -> tuple[int, set[str]]:
    rc, out = cli("verify", str(folder), "--profile", "vllm", "--base", f"tiny:{layout}", "--json", *extra)
    body = json.loads(out)
    found = {f["code"] for a in body["adapters"] for f in a["findings"] if f["severity"] == "error"}
    return rc, found


# ------------------------------------------------------------------------ remap --for vllm on every served layout

MOE = {
    "qwen3_moe_text": dict(target_modules=["q_proj", "v_proj"]),
    "qwen3_5_moe_text": dict(target_modules=["q_proj", "v_proj", "in_proj_qkv", "gate_proj", "down_proj"]),
    "qwen3_5_moe_vl": dict(target_modules=["q_proj", "v_proj"], exclude_modules=r".*visual.*"),
    "qwen3_omni_thinker": dict(
        target_modules=["q_proj", "v_proj"], exclude_modules=r".*(visual|audio_tower).*"
    ),
}
DENSE = [
    n for n, lay in LAYOUTS.items() if lay.tiny is not None and lay.experts is None and not lay.is_encoder
]


def test_every_remap_for_vllm_output_loads_in_vllm_and_in_peft(oracle_env: Any, tmp_path: Path) -> None:
    python = oracle_env("vllm")
    cases: list[tuple[str, str, Path, Any]] = []
    for layout, kw in MOE.items():
        pm = trained(layout, r=4, lora_alpha=8, target_parameters=FUSED, **kw)
        want = outputs(pm)
        fused = tmp_path / layout / "fused"
        pm.save_pretrained(str(fused))
        per = tmp_path / layout / "per-expert"
        remap(fused, experts="per-expert", out=per)
        cases += [(layout, "fused", fused, want), (layout, "per-expert", per, want)]
    for layout in DENSE:
        lay = LAYOUTS[layout]
        excl = lay.exclude_regex
        pm = trained(layout, r=4, lora_alpha=8, target_modules=list(lay.lora_leaves), exclude_modules=excl)
        folder = tmp_path / layout / "in"
        pm.save_pretrained(str(folder))
        cases.append((layout, "dense", folder, outputs(pm)))
    outs = []
    for layout, form, folder, want in cases:
        out = folder.parent / f"{form}-for-vllm"
        rc, text = cli("remap", str(folder), "--for", "vllm", "--base", f"tiny:{layout}", "--out", str(out))
        assert rc == 0, (layout, form, text)
        got = outputs(peft.PeftModel.from_pretrained(build_tiny(layout), str(out)).eval())
        assert rel(got, want) <= TOL, (layout, form)
        assert profile_codes(out, layout)[0] == 0, (layout, form)
        outs.append((layout, form, out))
    verdicts = vllm(python, [spec(layout, out) for layout, _, out in outs], tmp_path)
    served = set()
    for (layout, form, _), v in zip(outs, verdicts, strict=True):
        if v.get("served") is False:  # a class vLLM does not serve: nothing to load
            continue
        served.add(layout)
        assert v["ok"], (layout, form, v["error"])
        assert v["loras"], (layout, form)
    assert set(MOE) <= served


# ------------------------------------------------------------------------------ adapters PEFT writes, one by one

TEXT = "qwen3_5_text"
KINDS: dict[str, dict[str, Any]] = {
    "plain": dict(target_modules=["q_proj", "v_proj", "down_proj"]),
    "rslora": dict(target_modules=["q_proj"], use_rslora=True),
    "patterns": dict(
        target_modules=["q_proj", "v_proj"], rank_pattern={"v_proj": 8}, alpha_pattern={"v_proj": 3}
    ),
    "rank_over_max": dict(target_modules=["q_proj"], r=32),
    "pattern_over_max": dict(target_modules=["q_proj", "v_proj"], rank_pattern={"v_proj": 32}),
    "regex_targets": dict(target_modules=r".*\.(q_proj|v_proj)"),
    "dora": dict(target_modules=["q_proj"], use_dora=True),
    "lora_bias": dict(target_modules=["q_proj"], lora_bias=True),
    "bias_all": dict(target_modules=["q_proj"], bias="all"),
    "bias_lora_only": dict(target_modules=["q_proj"], bias="lora_only"),
    "embed_tokens": dict(target_modules=["embed_tokens", "q_proj"]),
    "lm_head": dict(target_modules=["lm_head", "q_proj"]),
    "modules_to_save_lm_head": dict(target_modules=["q_proj"], modules_to_save=["lm_head"]),
    "modules_to_save_norm": dict(target_modules=["q_proj"], modules_to_save=["norm"]),
    "linear_attention": dict(target_modules=["in_proj_qkv", "in_proj_z", "out_proj"]),
    "layers_to_transform": dict(target_modules=["q_proj", "v_proj"], layers_to_transform=[3]),
    "init_gaussian": dict(target_modules=["q_proj"], init_lora_weights="gaussian"),
    "trainable_tokens": dict(target_modules=["q_proj"], trainable_token_indices=[1, 2]),
}
EDITS: dict[str, dict[str, Any]] = {
    # config fields PEFT writes for features whose adapters need more than a tiny model to train
    "init_pissa": {"init_lora_weights": "pissa"},
    "alora": {"alora_invocation_tokens": [5, 6]},
    "layer_replication": {"layer_replication": [[0, 2], [1, 3]]},
    "qalora": {"use_qalora": True},
    "bdlora": {"use_bdlora": {"nblocks": 2}},
    "missing_alpha": {"lora_alpha": None},
    "modules_to_save_score": {"modules_to_save": ["score"]},
}


def test_vllm_verdict_equals_the_profile_on_what_peft_writes(oracle_env: Any, tmp_path: Path) -> None:
    python = oracle_env("vllm")
    folders: dict[str, Path] = {}
    for name, kw in KINDS.items():
        kw = {"r": 4, "lora_alpha": 8, **kw}
        folder = tmp_path / name
        trained(TEXT, **kw).save_pretrained(str(folder))
        folders[name] = folder
    for name, edit in EDITS.items():
        folder = tmp_path / name
        trained(TEXT, r=4, lora_alpha=8, target_modules=["q_proj"]).save_pretrained(str(folder))
        cfg = json.loads((folder / "adapter_config.json").read_text())
        for field, value in edit.items():
            if value is None:
                cfg.pop(field, None)
            else:
                cfg[field] = value
        (folder / "adapter_config.json").write_text(json.dumps(cfg))
        folders[name] = folder
    verdicts = vllm(python, [spec(TEXT, f) for f in folders.values()], tmp_path)
    disagree = []
    for (name, folder), v in zip(folders.items(), verdicts, strict=True):
        _, codes = profile_codes(folder, TEXT)
        refused = bool(codes & LOAD_CODES)
        if refused == v["ok"]:
            disagree.append(
                f"{name}: vLLM ok={v['ok']} ({v['error']}); profile load errors {sorted(codes & LOAD_CODES)}"
            )
    assert not disagree, "\n".join(disagree)

"""SGLang 0.5.23's own LoRA-loading code as the oracle (``scripts/sglang_oracle.py`` in the environment that
``.ci/oracles/sglang.sh`` builds): for every kind of adapter PEFT writes, SGLang's verdict (served with PEFT's
outputs, served with other outputs, the first request fails, refused at load) equals ``verify --profile sglang``'s;
and every ``remap --for sglang`` output loads in SGLang's code with PEFT's outputs (1e-5 relative, float32)."""

from __future__ import annotations

import json
import subprocess
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

from adapterdoc.engines.options import split_names  # noqa: E402
from adapterdoc.engines.sglang import verdict  # noqa: E402
from adapterdoc.ml.tiny import build_tiny  # noqa: E402

pytestmark = [pytest.mark.oracle, pytest.mark.ml]

ROOT = Path(__file__).resolve().parents[2]
ORACLE = ROOT / "scripts" / "sglang_oracle.py"
REL = 1e-5
TEXT = "ministral3_text"
MOE = "qwen3_moe_text"
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
IDS = torch.randint(3, 900, (2, 7), generator=torch.Generator().manual_seed(0)).tolist()

CASES: dict[str, tuple[str, dict[str, Any], tuple[str, ...]]] = {
    "clean": (TEXT, dict(target_modules=ALL), ()),
    "qv": (TEXT, dict(target_modules=["q_proj", "v_proj"]), ()),
    "rslora": (TEXT, dict(target_modules=ALL, use_rslora=True, r=16, lora_alpha=16), ()),
    "dora": (TEXT, dict(target_modules=ALL, use_dora=True), ()),
    "regex": (TEXT, dict(target_modules=r".*\.(q_proj|v_proj)"), ()),
    "all_linear": (TEXT, dict(target_modules="all-linear"), ()),
    "all_linear_narrow": (
        TEXT,
        dict(target_modules="all-linear"),
        ("--lora-target-modules", "q_proj,v_proj"),
    ),
    "qvo_narrow": (
        TEXT,
        dict(target_modules=["q_proj", "v_proj", "o_proj"]),
        ("--lora-target-modules", "q_proj"),
    ),
    "r32_cap": (TEXT, dict(target_modules=ALL, r=32, lora_alpha=64), ("--max-lora-rank", "24")),
    "rank_pattern": (TEXT, dict(target_modules=ALL, rank_pattern={"o_proj": 8}), ()),
    "alpha_pattern": (TEXT, dict(target_modules=ALL, alpha_pattern={"o_proj": 32}), ()),
    "exclude": (
        TEXT,
        dict(target_modules=["q_proj", "v_proj"], exclude_modules=["model.layers.1.self_attn.q_proj"]),
        (),
    ),
    "layers": (TEXT, dict(target_modules=ALL, layers_to_transform=[1, 2], layers_pattern="layers"), ()),
    "mts_head": (TEXT, dict(target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head"]), ()),
    "mts_norm": (TEXT, dict(target_modules=["q_proj", "v_proj"], modules_to_save=["input_layernorm"]), ()),
    "tokens": (TEXT, dict(target_modules=["q_proj", "v_proj"], trainable_token_indices=[0, 1]), ()),
    "embed": (TEXT, dict(target_modules=["embed_tokens", "q_proj", "v_proj"]), ()),
    "lm_head_tied": (TEXT, dict(target_modules=["lm_head", "q_proj", "v_proj"]), ()),
    "lm_head": (MOE, dict(target_modules=["lm_head", "q_proj", "v_proj"]), ()),
    "bias": (TEXT, dict(target_modules=ALL, lora_bias=True), ()),
    "q_only": (TEXT, dict(target_modules=["q_proj"]), ()),
    "kv": (TEXT, dict(target_modules=["k_proj", "v_proj"]), ()),
    "v_only": (TEXT, dict(target_modules=["v_proj", "o_proj"]), ()),
    "up_only": (TEXT, dict(target_modules=["up_proj", "down_proj"]), ()),
    "alora": (TEXT, dict(target_modules=["q_proj", "v_proj"], alora_invocation_tokens=[5, 6]), ()),
    "moe_attn": (MOE, dict(target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]), ()),
    "moe_fused": (MOE, dict(target_modules=["q_proj", "v_proj"], target_parameters=EXPERTS), ()),
    "moe_fused_down": (MOE, dict(target_modules=["q_proj", "v_proj"], target_parameters=EXPERTS[1:]), ()),
}
"""name → (tiny layout, LoraConfig keywords, verify's server options): each adapter written by real PEFT with
every trainable tensor random (a trained adapter: biases, magnitudes, saved modules and tokens included)."""

REMAPPED = [
    "rslora",
    "rank_pattern",
    "alpha_pattern",
    "regex",
    "q_only",
    "kv",
    "v_only",
    "up_only",
    "moe_fused",
]
"""Adapters ``remap --for sglang`` rewrites: each output must be served by SGLang with PEFT's outputs."""


def _cli(*args: str) -> Any:
    from click.testing import CliRunner

    from adapterdoc.cli import main

    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def _write(out: Path, layout: str, kw: dict[str, Any]) -> None:
    cfg = peft.LoraConfig(**{"r": 4, "lora_alpha": 8, **kw})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = peft.get_peft_model(build_tiny(layout), cfg)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, p in pm.named_parameters():
                if p.requires_grad:  # 1-D: norms and magnitudes near 1, biases near 0
                    centre = 1.0 if p.dim() == 1 and not name.endswith("bias") else 0.0
                    p.copy_(torch.randn(p.shape, generator=g) * 0.2 + centre)
        pm.save_pretrained(str(out))


def _peft_logits(adapter: Path, layout: str) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = peft.PeftModel.from_pretrained(build_tiny(layout), str(adapter)).eval()
        with torch.no_grad():
            return pm(input_ids=torch.tensor(IDS)).logits.float()


@pytest.fixture(scope="module")
def oracle(oracle_env: Callable[[str], Path], tmp_path_factory: Any) -> dict[str, Any]:
    """Every case and every remap --for sglang output, run through SGLang's code once: name → verdict."""
    python = oracle_env("sglang")
    root = tmp_path_factory.mktemp("sgo")
    bases: dict[str, Path] = {}
    jobs, meta = [], {}
    for name, (layout, kw, extra) in CASES.items():
        if layout not in bases:
            bases[layout] = root / f"base-{layout}"
            build_tiny(layout).save_pretrained(str(bases[layout]))
        folder = root / name
        _write(folder, layout, dict(kw))
        opts = dict(zip(extra[::2], extra[1::2]))
        job = dict(
            name=name,
            adapter=str(folder),
            base=str(bases[layout]),
            ids=IDS,
            max_lora_rank=int(opts["--max-lora-rank"]) if "--max-lora-rank" in opts else None,
            lora_target_modules=sorted(split_names(opts.get("--lora-target-modules")) or []) or None,
        )
        jobs.append(job)
        meta[name] = dict(layout=layout, folder=folder, extra=extra, want=_peft_logits(folder, layout))
        if name in REMAPPED:
            out = root / f"{name}-for-sglang"
            r = _cli("remap", str(folder), "--for", "sglang", "--base", f"tiny:{layout}", "--out", str(out))
            assert r.exit_code == 0, r.output
            jobs.append({**job, "name": f"{name}-for-sglang", "adapter": str(out)})
            meta[f"{name}-for-sglang"] = {**meta[name], "folder": out}
    (root / "jobs.json").write_text(json.dumps(jobs))
    (root / "served").mkdir()
    res = subprocess.run(
        [str(python), str(ORACLE), str(root / "jobs.json"), str(root / "served")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    verdicts = json.loads(res.stdout)
    from safetensors.torch import load_file

    for name, v in verdicts.items():
        v.update(meta[name])
        if v["verdict"] == "served":
            got = load_file(str(root / "served" / f"{name}.safetensors"))["logits"]
            want = v["want"]
            v["rel"] = float((got - want).abs().max() / want.abs().max())
            v["verdict"] = "accept" if v["rel"] <= REL else "wrong-output"
    return verdicts


@pytest.mark.parametrize("name", list(CASES))
def test_verify_agrees_with_sglang(oracle: dict[str, Any], name: str) -> None:
    got = oracle[name]
    r = _cli(
        "verify",
        str(got["folder"]),
        "--base",
        f"tiny:{got['layout']}",
        "--profile",
        "sglang",
        "--json",
        *got["extra"],
    )
    data = json.loads(r.stdout)
    codes = sorted({f["code"] for f in data["findings"] if f["severity"] == "error"})
    ours = verdict(codes)
    assert ours == got["verdict"], (
        codes,
        {k: got.get(k) for k in ("verdict", "stage", "error", "rel", "where")},
    )
    assert (r.exit_code == 0) == (ours == "accept"), codes


@pytest.mark.parametrize("name", REMAPPED)
def test_remap_output_is_served_with_peft_outputs(oracle: dict[str, Any], name: str) -> None:
    got = oracle[f"{name}-for-sglang"]
    assert got["verdict"] == "accept", {k: got.get(k) for k in ("verdict", "stage", "error", "rel", "where")}
    assert got["rel"] <= REL
    v = _cli("verify", str(got["folder"]), "--base", f"tiny:{got['layout']}", "--profile", "sglang")
    assert v.exit_code == 0, v.stdout


def test_the_oracle_tells_the_four_verdicts_apart(oracle: dict[str, Any]) -> None:
    """SGLang's code really runs: each verdict comes up, and where SGLang fails it says why in its own words."""
    seen: dict[str, list[str]] = {}
    for name in CASES:
        seen.setdefault(oracle[name]["verdict"], []).append(name)
    assert {v: len(n) for v, n in seen.items()}.keys() == {
        "accept",
        "refused",
        "first-request",
        "wrong-output",
    }
    assert all(len(n) >= 4 for n in seen.values()), seen
    assert "Cannot find target module name" in oracle["v_only"]["error"]
    assert "does not match weight shape" in oracle["rank_pattern"]["error"]
    assert "DoRA" in oracle["dora"]["error"]
    assert oracle["bias"]["rel"] > 1e-3 and oracle["clean"]["rel"] <= REL

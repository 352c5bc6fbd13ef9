"""`verify --profile tgi` and `--profile lorax`: every rule of the two exact-text-key engines, each broken by an
adapter that real PEFT wrote on a tiny model, fails with its code and exit 1 through the CLI; the clean adapter
passes with exit 0. The tiny base is a llama (a model type both engines serve with LoRA) saved as a folder; the
VL and model-type rules use the registry's tiny bases."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.ml

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LAYERS = 4


def _llama() -> Any:
    cfg = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=128,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return transformers.LlamaForCausalLM(cfg).eval()


def _save(model: Any, out: Path, name_or_path: str | None = None, safe: bool = True, **kw: Any) -> str:
    kw = {"r": 16, "lora_alpha": 32, "target_modules": ALL, "init_lora_weights": False, **kw}
    if name_or_path is not None:
        model.name_or_path = name_or_path
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(1)
        peft.get_peft_model(model, peft.LoraConfig(**kw)).save_pretrained(str(out), safe_serialization=safe)
    return str(out)


@pytest.fixture(scope="session")
def made(tmp_path_factory: Any, tiny_model: Any) -> dict[str, str]:
    """Name → adapter folder (and ``base``: the llama base folder)."""
    root = tmp_path_factory.mktemp("tgi-lorax")
    base = root / "base"
    _llama().save_pretrained(str(base))
    out: dict[str, str] = {"base": str(base)}
    plan: dict[str, dict[str, Any]] = {
        "clean": {},
        "bin": {"safe": False},
        "layers": {"target_modules": ["q_proj", "v_proj"], "layers_to_transform": [0, 1]},
        "lm_head": {"target_modules": ["q_proj", "lm_head"]},
        "embed": {"target_modules": ["q_proj", "embed_tokens"]},
        "dora": {"use_dora": True},
        "mts": {"target_modules": ["q_proj"], "modules_to_save": ["lm_head"]},
        "patterns": {"rank_pattern": {"v_proj": 32}},
        "alpha": {"alpha_pattern": {"o_proj": 64}},
        "arch": {"name_or_path": "tiny:qwen3_5_text"},
        "r4": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        "r4_one": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]},
        "r256": {"r": 256, "lora_alpha": 256, "target_modules": ["q_proj"]},
        "rslora": {"use_rslora": True},
    }
    for name, kw in plan.items():
        out[name] = _save(_llama(), root / name, **kw)
    nocfg = root / "nocfg.safetensors"
    shutil.copy(Path(out["clean"]) / "adapter_model.safetensors", nocfg)
    out["nocfg"] = str(nocfg)
    out["vl35"] = _save(tiny_model("qwen3_5_vl"), root / "vl35", target_modules=["q_proj", "v_proj"])
    out["qwenvl"] = _save(tiny_model("qwen_vl"), root / "qwenvl", target_modules=["q_proj", "v_proj"])
    out["text35"] = _save(tiny_model("qwen3_5_text"), root / "text35", target_modules=["q_proj", "v_proj"])
    return out


def _run(cli: Any, adapter: str, base: str, profile: str) -> tuple[int, dict[str, Any]]:
    res = cli("verify", adapter, "--base", base, "--profile", profile, "--json")
    return res.exit_code, json.loads(res.stdout)


def _codes(d: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["code"]: f for f in d["adapters"][0]["findings"]}


@pytest.mark.parametrize(("profile", "reads"), [("tgi", "AD453"), ("lorax", "AD475")])
def test_the_clean_text_adapter_passes(made: dict[str, str], cli: Any, profile: str, reads: str) -> None:
    rc, d = _run(cli, made["clean"], made["base"], profile)
    codes = _codes(d)
    assert rc == 0 and d["ok"] is True, codes
    assert [c for c, f in codes.items() if f["severity"] != "info"] == []
    assert (
        f"on {LAYERS} layer(s) ({2 * 7 * LAYERS} of {2 * 7 * LAYERS} LoRA tensors)" in codes[reads]["message"]
    )


@pytest.mark.parametrize(
    ("name", "profile", "code", "needle"),
    [
        ("bin", "tgi", "AD440", "weights are bin"),
        ("nocfg", "tgi", "AD441", "no adapter_config.json"),
        ("nocfg", "lorax", "AD461", "no adapter_config.json"),
        ("layers", "tgi", "AD443", "missing in layer(s) 2-3 of 4"),
        ("layers", "lorax", "AD463", "missing in layer(s) 2-3 of 4"),
        ("lm_head", "tgi", "AD444", "1 LoRA module(s)"),
        ("embed", "tgi", "AD444", "1 LoRA module(s)"),
        ("embed", "lorax", "AD464", "1 LoRA module(s)"),
        ("dora", "tgi", "AD445", "DoRA"),
        ("dora", "lorax", "AD465", "DoRA"),
        ("mts", "tgi", "AD446", "['lm_head']"),
        ("mts", "lorax", "AD466", "['lm_head']"),
        ("patterns", "tgi", "AD447", "PEFT 1, served 2"),
        ("patterns", "lorax", "AD467", "PEFT 1, served 2"),
        ("alpha", "tgi", "AD447", "PEFT 4, served 2"),
        ("arch", "tgi", "AD448", "Qwen3_5ForCausalLM"),
        ("arch", "lorax", "AD468", "Qwen3_5ForCausalLM"),
        ("r4", "lorax", "AD471", "v_proj 1 instead of 2"),
    ],
)
def test_each_rule_fails_with_its_code(
    made: dict[str, str], cli: Any, name: str, profile: str, code: str, needle: str
) -> None:
    rc, d = _run(cli, made[name], made["base"], profile)
    codes = _codes(d)
    assert rc == 1 and d["ok"] is False
    assert code in codes and codes[code]["severity"] == "error", codes
    assert needle in codes[code]["message"]
    assert f"{'TGI' if profile == 'tgi' else 'LoRAX'} " in codes[code]["message"]


def test_vl_keys_fail_with_the_remap_fix(made: dict[str, str], cli: Any) -> None:
    """TGI reads text-style keys on Qwen2.5-VL: the VL adapter PEFT writes would not be applied (and TGI's
    qwen2_5_vl class cannot load an adapter at all today: AD449)."""
    rc, d = _run(cli, made["qwenvl"], "tiny:qwen_vl", "tgi")
    codes = _codes(d)
    assert rc == 1 and "text_model.model" in codes["AD449"]["message"]
    assert codes["AD442"]["key"].startswith("base_model.model.model.language_model.layers.")
    assert codes["AD442"]["hint"] == f"adapterdoc remap {made['qwenvl']} --for tgi --out DIR"
    assert "applies nothing" in codes["AD453"]["message"]
    rc, d = _run(cli, made["vl35"], "tiny:qwen3_5_vl", "lorax")
    codes = _codes(d)
    assert rc == 1 and {"AD462", "AD469"} <= set(codes)
    assert codes["AD462"]["hint"] == f"adapterdoc remap {made['vl35']} --for lorax --out DIR"


@pytest.mark.parametrize(("profile", "code"), [("tgi", "AD449"), ("lorax", "AD469")])
def test_a_base_the_engine_cannot_serve_fails(
    made: dict[str, str], cli: Any, profile: str, code: str
) -> None:
    rc, d = _run(cli, made["text35"], "tiny:qwen3_5_text", profile)
    codes = _codes(d)
    assert rc == 1 and "'qwen3_5_text'" in codes[code]["message"]
    assert not {"AD442", "AD462"} & set(codes)  # the keys themselves are text-style
    want = "AD443" if profile == "tgi" else "AD463"  # a hybrid stack: self_attn in the last layer only
    dropped = sorted(f["message"] for f in d["adapters"][0]["findings"] if f["code"] == want)
    assert len(dropped) == 2 and all("missing in layer(s) 0-2 of 4" in m for m in dropped)
    assert "the base has no q_proj in layer(s) 0-2" in dropped[0] and "drops v_proj" in dropped[1]


def test_lm_head_is_per_architecture(made: dict[str, str], cli: Any) -> None:
    """LoRAX's llama class lists lm_head in ADAPTER_LAYERS; TGI's loader never loads it."""
    rc, d = _run(cli, made["lm_head"], made["base"], "lorax")
    assert rc == 0 and "q_proj, lm_head" in _codes(d)["AD475"]["message"]
    rc, d = _run(cli, made["lm_head"], made["base"], "tgi")
    assert rc == 1 and _codes(d)["AD444"]["key"] == "lm_head"


def test_rank_padding(made: dict[str, str], cli: Any) -> None:
    rc, d = _run(cli, made["r4"], made["base"], "lorax")
    codes = _codes(d)
    assert codes["AD470"]["severity"] == "info" and "q_proj 4→8, v_proj 4→8" in codes["AD470"]["message"]
    # 2 types x 4 layers x (A: 4 extra rows x 32 in; B: 4 extra cols x out 32 or 16)
    assert f"{4 * 4 * (32 + 32) + 4 * 4 * (32 + 16)} zero parameters" in codes["AD470"]["message"]
    assert codes["AD471"]["hint"] == f"adapterdoc remap {made['r4']} --for lorax --out DIR"
    rc, d = _run(cli, made["r4"], made["base"], "tgi")
    assert rc == 0 and _codes(d)["AD451"]["severity"] == "warning"
    rc, d = _run(cli, made["r4_one"], made["base"], "lorax")
    assert rc == 0 and "AD470" in _codes(d) and "AD471" not in _codes(d)
    rc, d = _run(cli, made["r256"], made["base"], "lorax")
    assert rc == 0 and "padded rank 256" in _codes(d)["AD472"]["message"]
    rc, d = _run(cli, made["clean"], made["base"], "lorax")
    assert not {"AD470", "AD471", "AD472"} & set(_codes(d))


def test_rslora_is_honoured(made: dict[str, str], cli: Any) -> None:
    """Both engines compute lora_alpha / sqrt(r) with use_rslora (get_scaling_factor): no finding."""
    for profile in ("tgi", "lorax"):
        rc, d = _run(cli, made["rslora"], made["base"], profile)
        assert rc == 0, _codes(d)


def test_lorax_bin_fails(made: dict[str, str], cli: Any) -> None:
    rc, d = _run(cli, made["bin"], made["base"], "lorax")
    assert rc == 1 and "weights are bin" in _codes(d)["AD460"]["message"]


ORACLE_PYTHON = Path(os.environ.get("ADAPTERDOC_LORAX_PYTHON", "/tmp/tgi-venv/bin/python"))
ORACLE_SERVER = Path(os.environ.get("ADAPTERDOC_LORAX_SERVER", "/tmp/tgi-oracle/lorax/server"))
"""A Python that imports LoRAX's server package, and LoRAX's ``server`` folder: torch (CPU), peft, transformers,
safetensors, loguru, requests, boto3, triton, opentelemetry-api, einops, grpcio-tools, and the protobuf module
generated as LoRAX's ``make gen-server`` does (see scripts/lorax_oracle.py)."""


def _oracle(adapter: str) -> dict[str, Any]:
    script = Path(__file__).parents[2] / "scripts" / "lorax_oracle.py"
    env = {**os.environ, "PYTHONPATH": str(ORACLE_SERVER)}
    res = subprocess.run(
        [str(ORACLE_PYTHON), str(script), adapter, str(LAYERS)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(
    not (ORACLE_PYTHON.exists() and (ORACLE_SERVER / "lorax_server" / "pb" / "generate_pb2.py").exists()),
    reason="no LoRAX oracle venv (set ADAPTERDOC_LORAX_PYTHON / ADAPTERDOC_LORAX_SERVER; see scripts/lorax_oracle.py)",
)
def test_we_refuse_everything_lorax_refuses(made: dict[str, str], cli: Any) -> None:
    """LoRAX's own loader (config, weight mapping, padding, scaling) on the CPU: every adapter it fails to load
    or serves differently from PEFT, the LoRAX profile fails too."""
    verdicts = {}
    for name in (
        "clean",
        "bin",
        "layers",
        "lm_head",
        "embed",
        "dora",
        "patterns",
        "alpha",
        "r4",
        "r4_one",
        "rslora",
    ):
        verdicts[name] = _oracle(made[name])
        if not verdicts[name]["ok"]:
            rc, d = _run(cli, made[name], made["base"], "lorax")
            assert rc == 1, (name, verdicts[name], _codes(d))
    assert verdicts["clean"]["ok"] and verdicts["lm_head"]["ok"] and verdicts["rslora"]["ok"]
    assert verdicts["r4"]["wrong"] and not verdicts["r4_one"]["wrong"]  # the padded rank rescales later types
    assert verdicts["layers"]["unused"] and verdicts["bin"]["error"]


def test_json_shape_and_versions(made: dict[str, str], cli: Any) -> None:
    from adapterdoc.engines.lorax import LORAX_VERSION
    from adapterdoc.engines.tgi import TGI_VERSION

    _, d = _run(cli, made["clean"], made["base"], "tgi")
    assert d["profile"] == "tgi" and d["tgi_version"] == TGI_VERSION and d["lorax_version"] is None
    assert d["vllm_version"] is None
    _, d = _run(cli, made["clean"], made["base"], "lorax")
    assert d["lorax_version"] == LORAX_VERSION and d["tgi_version"] is None
    f = _codes(d)["AD475"]
    assert set(f) >= {"code", "severity", "message", "path"} and f["path"] == made["clean"]


def test_codes_name_the_profiles_version() -> None:
    from adapterdoc.codes import lorax, tgi
    from adapterdoc.engines.lorax import LORAX_VERSION
    from adapterdoc.engines.lorax import PROFILE as LX
    from adapterdoc.engines.tgi import PROFILE as TG
    from adapterdoc.engines.tgi import TGI_VERSION

    assert tgi.CODES and all(c.summary.endswith(f"Describes TGI {TGI_VERSION}.") for c in tgi.CODES)
    assert lorax.CODES and all(c.summary.endswith(f"Describes LoRAX {LORAX_VERSION}.") for c in lorax.CODES)
    assert sorted(TG.codes.values()) == [c.code for c in tgi.CODES]
    assert sorted(LX.codes.values()) == [c.code for c in lorax.CODES]
    assert all("440" <= c.code[2:] <= "459" for c in tgi.CODES)
    assert all("460" <= c.code[2:] <= "479" for c in lorax.CODES)


@pytest.mark.parametrize("name", ["tgi", "lorax"])
def test_needs(name: str) -> None:
    from adapterdoc.engines import get_profile
    from adapterdoc.engines.base import EngineNeeds

    needs = get_profile(name).needs("qwen3_5_vl")
    assert needs == EngineNeeds(
        keys="text",
        expert_lora=False,
        rslora=True,
        patterns=False,
        regex_targets=True,
        dora=False,
        modules_to_save=False,
        version=get_profile(name).version,  # type: ignore[attr-defined]
        rank_padding=(8, 16),
        fill="layer-types",
    )

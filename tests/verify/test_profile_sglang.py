"""``verify --profile sglang``: every SGLang rule (AD420-AD438) fails an adapter PEFT wrote that breaks it, through
the CLI with exit 1, and the clean adapter passes with exit 0; the options, the JSON fields and the fix commands."""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.codes import catalogue
from adapterdoc.engines import get_profile
from adapterdoc.engines.options import MAX_LORA_RANK
from adapterdoc.engines.sglang import SGLANG_VERSION
from adapterdoc.verify import VerifyOptions

pytestmark = pytest.mark.ml

TEXT = "ministral3_text"
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]

ADAPTERS: dict[str, tuple[str, dict[str, Any]]] = {
    "clean": (TEXT, dict(target_modules=ALL)),
    "rslora": (TEXT, dict(target_modules=ALL, r=16, lora_alpha=16, use_rslora=True)),
    "dora": (TEXT, dict(target_modules=ALL, use_dora=True)),
    "regex": (TEXT, dict(target_modules=r".*\.(q_proj|v_proj)")),
    "r32": (TEXT, dict(target_modules=ALL, r=32, lora_alpha=64)),
    "qvo": (TEXT, dict(target_modules=["q_proj", "v_proj", "o_proj"])),
    "mts": (TEXT, dict(target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head"])),
    "kv": (TEXT, dict(target_modules=["k_proj", "v_proj"])),
    "all_linear": (TEXT, dict(target_modules="all-linear")),
    "tokens": (TEXT, dict(target_modules=["q_proj", "v_proj"], trainable_token_indices=[0, 1])),
    "rank_pattern": (TEXT, dict(target_modules=ALL, rank_pattern={"o_proj": 8})),
    "alpha_pattern": (TEXT, dict(target_modules=ALL, alpha_pattern={"o_proj": 32})),
    "q_only": (TEXT, dict(target_modules=["q_proj"])),
    "bias": (TEXT, dict(target_modules=ALL, lora_bias=True)),
    "linear_attn": ("qwen3_5_text", dict(target_modules=["q_proj", "v_proj", "in_proj_qkv"])),
    "tower": ("qwen3_5_vl", dict(target_modules=["q_proj", "v_proj", "qkv"])),
    "fused": ("qwen3_moe_text", dict(target_modules=["q_proj", "v_proj"], target_parameters=EXPERTS)),
    "fused_down": (
        "qwen3_moe_text",
        dict(target_modules=["q_proj", "v_proj"], target_parameters=EXPERTS[1:]),
    ),
    "embed": (TEXT, dict(target_modules=["embed_tokens", "q_proj", "v_proj"])),
    "lm_head_tied": (TEXT, dict(target_modules=["lm_head", "q_proj", "v_proj"])),
    "lm_head": ("qwen3_moe_text", dict(target_modules=["lm_head", "q_proj", "v_proj"])),
    "v_only": (TEXT, dict(target_modules=["v_proj", "o_proj"])),
    "up_only": (TEXT, dict(target_modules=["up_proj", "down_proj"])),
    "mts_norm": (TEXT, dict(target_modules=["q_proj", "v_proj"], modules_to_save=["input_layernorm"])),
    "alora": (TEXT, dict(target_modules=["q_proj", "v_proj"], alora_invocation_tokens=[5, 6])),
}
"""name → (tiny layout, LoraConfig keywords): each written by real PEFT (``get_peft_model`` + ``save_pretrained``)."""


def _peft_adapter(out: Path, layout: str, kw: dict[str, Any], tiny_model: Any) -> None:
    import peft
    import torch

    kw = {"r": 4, "lora_alpha": 8, "init_lora_weights": False, **kw}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(1)
        pm = peft.get_peft_model(tiny_model(layout), peft.LoraConfig(**kw))
        pm.save_pretrained(str(out))


@pytest.fixture(scope="session")
def sg(tmp_path_factory: Any, tiny_model: Any) -> Callable[[str], str]:
    """``sg(name)``: the adapter folder of :data:`ADAPTERS` ``name`` (written once per session); ``loha`` is a
    PEFT LoHa adapter, ``added`` the clean one with an added token, ``per_expert*`` the fused ones rewritten one
    LoRA per expert by ``remap --experts per-expert``."""
    cache: dict[str, str] = {}

    def get(name: str) -> str:
        if name in cache:
            return cache[name]
        out = tmp_path_factory.mktemp("sg") / name
        if name in ADAPTERS:
            _peft_adapter(out, *ADAPTERS[name], tiny_model)
        elif name == "no_alpha":  # PEFT always writes lora_alpha: this one is edited by hand
            shutil.copytree(get("clean"), out)
            cfg = json.loads((out / "adapter_config.json").read_text())
            del cfg["lora_alpha"]
            (out / "adapter_config.json").write_text(json.dumps(cfg))
        elif name == "added":
            shutil.copytree(get("clean"), out)
            vocab = tiny_model(TEXT).config.get_text_config().vocab_size
            (out / "added_tokens.json").write_text(json.dumps({"<tool>": vocab, "<s>": 1}))
        elif name == "resized":  # the vocabulary grown by 8 tokens, then LoRA on the embedding
            model = tiny_model(TEXT)
            model.resize_token_embeddings(1008)
            _peft_adapter(
                out, TEXT, dict(target_modules=["embed_tokens", "q_proj", "v_proj"]), lambda _: model
            )
        elif name == "trained_copy":  # the embedding copy changed by hand: it no longer equals the base's
            from safetensors.torch import load_file, save_file

            shutil.copytree(get("embed"), out)
            st = out / "adapter_model.safetensors"
            tensors = load_file(str(st))
            tensors["base_model.model.model.embed_tokens.base_layer.weight"][3, 0] += 1.0
            save_file(tensors, str(st))
        elif name.startswith("per_expert"):
            src = get("fused" + name[len("per_expert") :])
            from adapterdoc.commands.remap_cmd import command  # noqa: F401  (the command exists on this branch)

            r = _cli("remap", src, "--experts", "per-expert", "--out", str(out))
            assert r.exit_code == 0, r.output
        else:
            raise KeyError(name)
        cache[name] = str(out)
        return cache[name]

    return get


def _cli(*args: str) -> Any:
    from click.testing import CliRunner

    from adapterdoc.cli import main

    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


BASES = {name: f"tiny:{layout}" for name, (layout, _) in ADAPTERS.items()}
BASES.update(no_alpha=f"tiny:{TEXT}", added=f"tiny:{TEXT}", per_expert="tiny:qwen3_moe_text")
BASES["per_expert_down"] = "tiny:qwen3_moe_text"
BASES.update(resized=f"tiny:{TEXT}", trained_copy=f"tiny:{TEXT}")


def run(sg: Callable[[str], str], name: str, *extra: str) -> tuple[int, dict[str, Any]]:
    """``verify NAME --profile sglang --json`` → (exit code, the adapter's JSON)."""
    r = _cli(
        "verify",
        sg(name),
        "--base",
        BASES[name],
        "--profile",
        "sglang",
        "--scan",
        "nonzero",
        "--json",
        *extra,
    )
    data = json.loads(r.stdout)
    return r.exit_code, data


def errors(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["code"]: f for f in data["findings"] if f["severity"] == "error"}


RULES = [
    ("rslora", (), "AD420"),
    ("dora", (), "AD421"),
    ("no_alpha", (), "AD422"),
    ("regex", (), "AD423"),
    ("r32", ("--max-lora-rank", "24"), "AD424"),
    ("qvo", ("--lora-target-modules", "q_proj", "--lora-target-modules", "v_proj"), "AD425"),
    ("mts", (), "AD426"),
    ("kv", (), "AD427"),
    ("all_linear", ("--lora-target-modules", "q_proj,v_proj"), "AD427"),
    ("tokens", (), "AD428"),
    ("per_expert_down", (), "AD429"),
    ("fused", (), "AD430"),
    ("added", (), "AD431"),
    ("tower", (), "AD432"),
    ("rank_pattern", (), "AD433"),
    ("alpha_pattern", (), "AD434"),
    ("q_only", (), "AD435"),
    ("linear_attn", (), "AD436"),
    ("bias", (), "AD438"),
    ("v_only", (), "AD427"),
    ("up_only", (), "AD427"),
    ("mts_norm", (), "AD493"),
    ("resized", (), "AD490"),
    ("trained_copy", (), "AD490"),
    ("alora", (), "AD494"),
]


@pytest.mark.parametrize(("name", "extra", "code"), RULES, ids=[f"{c}-{n}" for n, _, c in RULES])
def test_each_rule_fails_its_adapter(
    sg: Callable[[str], str], name: str, extra: tuple[str, ...], code: str
) -> None:
    rc, data = run(sg, name, *extra)
    assert rc == 1 and data["ok"] is False, data["findings"]
    found = errors(data)
    assert code in found, sorted(found)
    assert found[code]["message"].startswith(f"SGLang {SGLANG_VERSION}: ")


def test_clean_adapter_passes(sg: Callable[[str], str]) -> None:
    rc, data = run(sg, "clean")
    assert rc == 0 and data["ok"] is True, errors(data)
    (assumed,) = [f for f in data["findings"] if f["code"] == "AD437"]
    assert "['down_proj', 'gate_up_proj', 'o_proj', 'qkv_proj']" in assumed["message"]
    assert run(sg, "per_expert")[0] == 0  # both expert projections, one LoRA per expert: SGLang reads it


@pytest.mark.parametrize("name", ["embed", "lm_head_tied", "lm_head"])
def test_embedding_and_lm_head_lora_pass(sg: Callable[[str], str], name: str) -> None:
    """SGLang applies LoRA on embed_tokens and on lm_head, a tied one too, and skips PEFT's base_layer.weight copy
    on purpose: it is no modules_to_save tensor (once a false AD426), and here it equals the base's."""
    rc, data = run(sg, name)
    assert rc == 0 and data["ok"] is True, errors(data)
    (copy,) = [f for f in data["findings"] if f["code"] == "AD491"]
    assert "equals the base's" in copy["message"] and copy["key"].endswith(".base_layer.weight")


@pytest.mark.parametrize(("name", "why"), [("resized", "resized vocabulary"), ("trained_copy", "differs")])
def test_embedding_copy_that_differs_fails(sg: Callable[[str], str], name: str, why: str) -> None:
    rc, data = run(sg, name)
    assert rc == 1
    msg = errors(data)["AD490"]["message"]
    assert why in msg and "serving the base's own embed_tokens" in msg


def test_embedding_copy_without_base_weights_is_checked_by_shape(
    sg: Callable[[str], str], tiny_model: Any, tmp_path: Path
) -> None:
    """A config-only base cannot be compared by value: the shapes decide (a resized vocabulary still fails)."""
    tiny_model(TEXT).config.save_pretrained(str(tmp_path))
    cfg = str(tmp_path / "config.json")
    ok = json.loads(_cli("verify", sg("embed"), "--base", cfg, "--profile", "sglang", "--json").stdout)
    (copy,) = [f for f in ok["findings"] if f["code"] == "AD491"]
    assert ok["ok"] and "not compared" in copy["message"]
    bad = _cli("verify", sg("resized"), "--base", cfg, "--profile", "sglang", "--json")
    assert bad.exit_code == 1 and "AD490" in errors(json.loads(bad.stdout))


def test_lora_bias_is_said_to_be_dropped(sg: Callable[[str], str]) -> None:
    msg = errors(run(sg, "bias")[1])["AD438"]["message"]
    assert "dropped" in msg and "overwrites" in msg and "shape" not in msg


@pytest.mark.parametrize(
    ("name", "code", "error"),
    [
        ("v_only", "AD427", "ValueError"),
        ("up_only", "AD427", "ValueError"),
        ("kv", "AD427", "ValueError"),
        ("mts_norm", "AD493", "ValueError"),
        ("rank_pattern", "AD433", "shape assertion"),
    ],
)
def test_first_request_failures_say_so(sg: Callable[[str], str], name: str, code: str, error: str) -> None:
    """These load and the server starts; the first request that uses the adapter fails (SGLang copies it into
    its memory pool then): the message says that, not "skipped"."""
    msg = errors(run(sg, name)[1])[code]["message"]
    assert "SGLang starts, then the first request that uses the adapter fails" in msg and error in msg
    assert "skipped" not in msg


@pytest.mark.parametrize("name", ["rslora", "regex", "fused", "rank_pattern", "alpha_pattern"])
def test_fixable_findings_print_the_fix_command(sg: Callable[[str], str], name: str) -> None:
    _, data = run(sg, name)
    hints = [f.get("hint") or "" for f in errors(data).values()]
    assert f"adapterdoc remap {sg(name)} --for sglang --out DIR" in hints


def test_rank_option_is_sglangs_own(sg: Callable[[str], str]) -> None:
    assert run(sg, "r32")[0] == 0  # no --max-lora-rank: SGLang sizes its pool from the adapters
    assert run(sg, "r32", "--max-lora-rank", "32")[0] == 0
    rc, data = run(sg, "r32", "--max-lora-rank", "24")
    assert rc == 1
    assert "start the server with --max-lora-rank 32" in errors(data)["AD424"]["hint"]
    bad = _cli("verify", sg("r32"), "--base", BASES["r32"], "--profile", "vllm", "--max-lora-rank", "24")
    assert bad.exit_code == 2 and "one of 1, 8, 16" in bad.output  # vLLM's values still checked under vllm
    assert MAX_LORA_RANK.of(VerifyOptions(profile="sglang")) is None
    assert MAX_LORA_RANK.of(VerifyOptions(profile="vllm")) == 16 == MAX_LORA_RANK.of(VerifyOptions())


def test_target_modules_option(sg: Callable[[str], str]) -> None:
    assert run(sg, "qvo", "--lora-target-modules", "q_proj,v_proj,o_proj")[0] == 0
    assert run(sg, "qvo", "--lora-target-modules", "all")[0] == 0
    assert run(sg, "all_linear", "--lora-target-modules", "all")[0] == 0
    for bad in (["--lora-target-modules", "q_proj,conv1d"], ["--lora-target-modules", "all,q_proj"]):
        r = _cli("verify", sg("qvo"), "--base", BASES["qvo"], "--profile", "sglang", *bad)
        assert r.exit_code == 2, r.output


def test_json_fields(sg: Callable[[str], str]) -> None:
    rc, data = run(sg, "qvo", "--lora-target-modules", "q_proj v_proj,o_proj", "--max-lora-rank", "24")
    assert rc == 0
    assert data["profile"] == "sglang" and data["sglang_version"] == SGLANG_VERSION
    assert data["lora_target_modules"] == ["q_proj", "v_proj", "o_proj"] and data["max_lora_rank"] == 24
    assert data["vllm_version"] is None
    vllm = json.loads(
        _cli("verify", sg("clean"), "--base", BASES["clean"], "--profile", "vllm", "--json").stdout
    )
    assert (
        vllm["max_lora_rank"] == 16 and vllm["sglang_version"] is None and vllm["lora_target_modules"] is None
    )


def test_pyproject_keys(sg: Callable[[str], str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text(
        '[tool.adapterdoc]\nprofile = "sglang"\nlora-target-modules = ["q_proj", "v_proj"]\nmax-lora-rank = 24\n'
    )
    r = _cli("verify", sg("qvo"), "--base", BASES["qvo"], "--json")
    assert r.exit_code == 1 and "AD425" in errors(json.loads(r.stdout))
    assert _cli("verify", sg("qvo"), "--base", BASES["qvo"], "--lora-target-modules", "all").exit_code == 0
    (tmp_path / "pyproject.toml").write_text(
        '[tool.adapterdoc]\nprofile = "sglang"\nlora-target-modules = "x"\n'
    )
    r = _cli("verify", sg("qvo"), "--base", BASES["qvo"])
    assert r.exit_code == 3 and "lora-target-modules" in r.stderr


def test_needs_and_codes_name_the_release() -> None:
    needs = get_profile("sglang").needs("ministral3_text")
    assert needs is not None and needs.version == SGLANG_VERSION
    assert (needs.keys, needs.experts, needs.rslora, needs.patterns, needs.regex_targets) == (
        "as-is",
        "per-expert",
        False,
        False,
        False,
    )
    assert not needs.dora and not needs.modules_to_save
    mine = [c for c in catalogue().values() if "AD420" <= c.code <= "AD439" or "AD490" <= c.code <= "AD499"]
    assert {c.code for c in mine} >= {code for _, _, code in RULES} | {"AD437"}
    assert all(f"SGLang {SGLANG_VERSION}." in c.summary for c in mine)


# SGLang's own code on every kind of adapter, and on remap --for sglang's outputs: test_sglang_oracle.py (-m oracle)

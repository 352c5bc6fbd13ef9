"""The profile seam: the registry lists the profiles, the CLI's ``--profile`` choices are its names, and a profile
registered from outside is run by ``verify`` (its findings and its JSON keys), with no change to verify itself."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.codes import catalogue
from adapterdoc.engines import PROFILES, Profile, get_profile, profile_names, register
from adapterdoc.engines.vllm import VLLM_VERSION
from adapterdoc.report.findings import Finding, make
from adapterdoc.verify import VerifyOptions, verify


class EchoProfile(Profile):
    """A stand-in engine: one finding naming the adapter's layout, one run-level JSON key."""

    name = "echo"
    summary = "echo serving"
    options = ("served_as",)

    def findings(
        self, spec: str, report: Any, keys: list[Any], meta: Any, options: Any, config: Any
    ) -> list[Finding]:
        lora = sum(1 for k in keys if k.is_lora)
        return [
            make("AD416", f"echo: {lora} LoRA key(s), layout {report.layout} on {meta.layout}", path=spec)
        ]

    def run_fields(self, options: Any, *, active: bool) -> dict[str, Any]:
        return {"echo_version": "1.0" if active else None}


@pytest.fixture
def echo() -> Iterator[Profile]:
    """The echo profile, registered for one test only."""
    profile = register(EchoProfile())
    assert PROFILES["echo"] is profile and profile_names()[-1] == "echo"
    yield profile
    del PROFILES["echo"]


def test_registry_lists_peft_then_vllm() -> None:
    assert profile_names()[:2] == ("peft", "vllm") and {"peft", "vllm", "sglang", "tgi", "lorax"} <= set(
        PROFILES
    )
    assert all(isinstance(p, Profile) and p.name == n for n, p in PROFILES.items())
    assert get_profile("vllm").options == ("max_lora_rank", "served_as")
    with pytest.raises(ValueError, match=r"unknown profile 'nosuch'; choose from peft, vllm, "):
        VerifyOptions(profile="nosuch")


def test_cli_profile_choices_come_from_the_registry() -> None:
    from adapterdoc.commands.verify_cmd import command

    option = next(p for p in command.params if p.name == "profile")
    assert tuple(option.type.choices) == tuple(PROFILES)
    assert option.help.startswith("Rules to apply: PEFT loading (default), vLLM serving, ")
    assert "TGI serving" in option.help and "LoRAX serving" in option.help


def test_serving_codes_name_the_profiles_vllm_release() -> None:
    """The code catalogue's explanations and the vLLM profile describe the same release."""
    serving = [c for c in catalogue().values() if c.name.startswith("vllm-")]
    assert serving and all(f"vLLM {VLLM_VERSION}." in c.summary for c in serving)


def test_a_registered_profile_is_run_by_verify(echo: Profile, tmp_path: Path) -> None:
    from small_adapters import BASE, write_small_adapter

    adapter = str(write_small_adapter(tmp_path / "a"))
    run = verify([adapter], BASE, VerifyOptions(profile="echo", scan="nonzero"))
    report = run.adapters[0]
    mine = [f for f in report.findings if f.message.startswith("echo:")]
    assert [f.message for f in mine] == [f"echo: 2 LoRA key(s), layout {report.layout} on ministral3_text"]
    assert report.error is None and not any(f.message.startswith("vLLM") for f in report.findings)
    d = json.loads(json.dumps(run.to_dict()))
    assert d["profile"] == "echo" and d["echo_version"] == "1.0"
    assert d["max_lora_rank"] is None and d["vllm_version"] is None  # the other profiles' keys stay, null
    order = list(d)[: list(d).index("served_as")]
    assert order[order.index("profile") :][:3] == ["profile", "max_lora_rank", "vllm_version"]
    assert order[-1] == "echo_version" and {"sglang_version", "tgi_version", "lorax_version"} <= set(order)
    peft = verify([adapter], BASE, VerifyOptions(scan="nonzero")).to_dict()
    assert peft["echo_version"] is None and not any(
        f["message"].startswith("echo:") for f in peft["findings"]
    )


# ------------------------------------------------------------------------ vLLM rules, re-read from its source


def _vllm(adapter: Path, base: str) -> dict[str, Finding]:
    report = verify([str(adapter)], base, VerifyOptions(profile="vllm", scan="nonzero")).adapters[0]
    assert report.error is None, report.error
    return {f.code: f for f in report.findings}


def test_vllm_one_full_classification_module_per_adapter(tmp_path: Path) -> None:
    """vLLM accepts ``modules_to_save`` of ``classifier``/``score``, but loads one full module per adapter
    (lora_model.py ``from_lora_tensors``: "Only one full classification module is supported per adapter")."""
    import numpy as np
    from safetensors.numpy import load_file, save_file
    from small_adapters import BASE, write_small_adapter

    folder = write_small_adapter(tmp_path / "a")
    cfg = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(
        json.dumps({**cfg, "modules_to_save": ["classifier", "score"]})
    )
    assert "AD403" not in _vllm(folder, BASE)  # the field alone is accepted
    tensors = load_file(folder / "adapter_model.safetensors")
    for head in ("score", "classifier"):
        tensors[f"base_model.model.{head}.weight"] = np.ones((2, 64), np.float32)
        save_file(tensors, folder / "adapter_model.safetensors", metadata={"format": "pt"})
        found = _vllm(folder, BASE).get("AD403")
        if head == "score":  # one full module: loaded
            assert found is None
        else:
            assert found is not None and found.severity == "error"
            assert "['classifier', 'score']" in found.message and "only one full" in found.message


def _fused(tiny_model: Any, layout: str, out: Path, targets: list[str], *, drop_outer: bool = False) -> Path:
    """A real PEFT fused-expert adapter (``target_parameters``); ``drop_outer`` keeps only the
    ``experts.base_layer`` (gate_up) keys, a lone gate_up that nothing names as down_proj."""
    torch = pytest.importorskip("torch")
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file, save_file

    pm = get_peft_model(
        tiny_model(layout),
        LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"], target_parameters=targets, lora_dropout=0.0),
    )
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_()
    pm.save_pretrained(str(out))
    if drop_outer:
        path = out / "adapter_model.safetensors"
        t = load_file(path)
        kept = {k: v for k, v in t.items() if ".experts.lora_" not in k}
        assert len(kept) < len(t) and any(".experts.base_layer.lora_" in k for k in kept)
        save_file(kept, path, metadata={"format": "pt"})
        cfg = json.loads((out / "adapter_config.json").read_text())
        (out / "adapter_config.json").write_text(json.dumps({**cfg, "target_parameters": ["gate_up_proj"]}))
    return out


@pytest.mark.ml
@pytest.mark.parametrize(
    ("targets", "drop_outer", "said"),
    [
        (["gate_up_proj", "down_proj"], False, "refuses the fused 3-D expert weights"),
        # PEFT saves a lone wrapper as `experts.lora_*`: vLLM reads it as down_proj and refuses it the same way
        (["gate_up_proj"], False, "refuses the fused 3-D expert weights"),
        (["gate_up_proj", "down_proj"], True, "applied nowhere"),
    ],
    ids=["pair", "lone-gate_up", "base_layer-only"],
)
def test_vllm_fused_adapter_on_a_2d_moe_class(
    tiny_model: Any, tmp_path: Path, targets: list[str], drop_outer: bool, said: str
) -> None:
    """``FusedMoEWithLoRA`` (``is_3d_moe_weight`` False) refuses a fused ``experts`` tensor at load
    (model_manager.py ``_validate_moe_lora_format``); only a fused gate_up alone passes silently."""
    pytest.importorskip("peft.utils.transformers_weight_conversion")
    folder = _fused(tiny_model, "qwen3_moe_text", tmp_path / "a", targets, drop_outer=drop_outer)
    f = _vllm(folder, "tiny:qwen3_moe_text")["AD418"]
    assert f.severity == "error" and said in f.message and "base_layer" in f.message, f.message
    assert ("--enable-mixed-moe-lora-format" in f.message) is (not drop_outer)
    assert f.hint == f"adapterdoc remap {folder} --experts per-expert --out DIR"


@pytest.mark.ml
@pytest.mark.parametrize(
    ("targets", "drop_outer", "said"),
    [
        (["down_proj"], False, "the load fails"),
        (["gate_up_proj"], False, "the load fails"),  # the lone wrapper is `experts`: read as down_proj
        (["gate_up_proj", "down_proj"], True, "applied nowhere"),
    ],
    ids=["down-only", "gate_up-only", "base_layer-only"],
)
def test_vllm_half_a_fused_pair_on_a_3d_moe_class(
    tiny_model: Any, tmp_path: Path, targets: list[str], drop_outer: bool, said: str
) -> None:
    """``FusedMoE3DWithLoRA`` stacks only when ``experts`` carries LoRA, asserting ``experts.base_layer``
    beside it (model_manager.py ``_stack_moe_lora_weights``)."""
    pytest.importorskip("peft.utils.transformers_weight_conversion")
    folder = _fused(tiny_model, "qwen3_5_moe_vl", tmp_path / "a", targets, drop_outer=drop_outer)
    codes = _vllm(folder, "tiny:qwen3_5_moe_vl")
    assert "AD418" not in codes
    assert codes["AD419"].severity == "error" and said in codes["AD419"].message, codes["AD419"].message
    both = _vllm(
        _fused(tiny_model, "qwen3_5_moe_vl", tmp_path / "b", ["gate_up_proj", "down_proj"]),
        "tiny:qwen3_5_moe_vl",
    )
    assert not {"AD418", "AD419"} & set(both)


@pytest.mark.ml
def test_vllm_per_expert_adapter_on_a_3d_moe_class(tiny_model: Any, tmp_path: Path) -> None:
    """A 3-D class's name check expects no ``experts.N.*`` module (lora_model.py ``check_unexpected_modules``):
    the per-expert spelling of a good fused adapter is refused at load."""
    pytest.importorskip("peft.utils.transformers_weight_conversion")
    from adapterdoc.remap import remap

    fused = _fused(tiny_model, "qwen3_5_moe_vl", tmp_path / "a", ["gate_up_proj", "down_proj"])
    remap(str(fused), experts="per-expert", out=str(tmp_path / "per"))
    f = _vllm(tmp_path / "per", "tiny:qwen3_5_moe_vl")["AD418"]
    assert f.severity == "error" and "refuses the per-expert modules" in f.message, f.message
    assert "--enable-mixed-moe-lora-format" in f.message
    assert f.hint == f"adapterdoc remap {tmp_path / 'per'} --experts fused --out DIR"


# ----------------------------------------------------------- what the engines declare: options, remap --for's rules


def test_engine_options_are_the_engines_declarations() -> None:
    """verify's engine flags, their help and the [tool.adapterdoc] keys come from engines/options.py and the
    profiles that read them (each adds its clause to a shared option's help); verify declares none itself."""
    from adapterdoc.commands.verify_cmd import command
    from adapterdoc.engines.options import MAX_LORA_RANK, OPTIONS
    from adapterdoc.verify.project import TABLE_KEYS

    flags = [p.opts[0] for p in command.params if p.opts[0] in {o.flag for o in OPTIONS}]
    assert flags == [o.flag for o in OPTIONS] == ["--max-lora-rank", "--lora-target-modules", "--served-as"]
    rank = next(p for p in command.params if p.opts[0] == "--max-lora-rank")
    assert rank.help == MAX_LORA_RANK.help_text(PROFILES.values())
    assert (
        rank.help.startswith("The server's --max-lora-rank: vLLM one of 1, 8, 16, ")
        and "; SGLang any" in rank.help
    )
    assert {o.key: o.name for o in OPTIONS}.items() <= TABLE_KEYS.items()


def test_verify_options_take_engine_options_by_name() -> None:
    from adapterdoc.engines.options import LORA_TARGET_MODULES, MAX_LORA_RANK, SERVED_AS

    o = VerifyOptions(profile="sglang", max_lora_rank=64, lora_target_modules=["q_proj"], served_as="vl")
    assert (MAX_LORA_RANK.of(o), LORA_TARGET_MODULES.of(o), SERVED_AS.of(o)) == (64, ("q_proj",), "vl")
    assert o == VerifyOptions(
        "sglang", engine_options={"max_lora_rank": 64, "lora_target_modules": ("q_proj",), "served_as": "vl"}
    )
    assert (
        MAX_LORA_RANK.of(VerifyOptions()) == 16 and MAX_LORA_RANK.of(VerifyOptions(profile="sglang")) is None
    )
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_rank'"):
        VerifyOptions(max_rank=8)
    with pytest.raises(ValueError, match="served_as must be text or vl, got 'xx'"):
        VerifyOptions(served_as="xx")


class PairsProfile(Profile):
    """A stand-in serving engine with a zero-LoRA rule of its own (SGLang's partner rule)."""

    name = "pairs"
    summary = "pairs serving"

    def needs(self, base_layout: str | None, options: Any = None) -> Any:
        from adapterdoc.engines.base import EngineNeeds

        return EngineNeeds(fill="v-for-q", version="1")

    def zero_lora(self, a: Any) -> Any:
        from adapterdoc.engines.sglang_keys import missing_partners
        from adapterdoc.engines.zero_lora import ZeroLora

        return ZeroLora(missing_partners(a.factors))


def test_a_registered_engine_drives_remap_for(tmp_path: Path) -> None:
    """``remap --for`` asks the engine's profile for its rules: a profile registered from outside adds its zero
    LoRA with no change to remap."""
    from small_adapters import BASE, write_small_adapter

    from adapterdoc.remap import remap

    register(PairsProfile())
    try:
        report = remap(str(write_small_adapter(tmp_path / "a")), engine="pairs", base=BASE, dry_run=True)
    finally:
        del PROFILES["pairs"]
    fill = next(r for r in report.rewrites if r["rewrite"] == "fill")
    assert fill["fill"] == "v-for-q" and fill["added"] == {"v_proj": [0]}
    assert report.engine["needs"]["fill"] == "v-for-q"

"""`verify --profile tgi|lorax` on a VL base: the engines read text-style keys (``base_model.model.model.layers.{i}``)
even there, so the key checks (AD220-AD223) are made against the base's text model (``Profile.keys_against``), on
the registry path and on the meta-device path alike. Real PEFT adapters on the registry's tiny VL models; the bases
are their configs saved as folders (so the registry path can decide) and the ``tiny:`` bases (meta device)."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
pytest.importorskip("transformers")

pytestmark = pytest.mark.ml

PATHS = ("auto", "meta-device")
KEY_CODES = {"AD220", "AD221", "AD222", "AD223", "AD442", "AD462"}


def _base(root: Path, layout: str) -> str:
    from adapterdoc.ml.tiny import model_class, tiny_config

    cfg = tiny_config(layout)
    cfg.architectures = [model_class(layout).__name__]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg.save_pretrained(root / f"base-{layout}")
    return str(root / f"base-{layout}")


def _adapter(model: Any, out: Path) -> str:
    cfg = peft.LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(1)
        peft.get_peft_model(model, cfg).save_pretrained(str(out))
    return str(out)


def _keys(folder: str) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(Path(folder) / "adapter_model.safetensors"), "np") as f:
        return sorted(f.keys())


@pytest.fixture(scope="session")
def made(tmp_path_factory: Any, tiny_model: Any) -> dict[str, str]:
    from click.testing import CliRunner

    from adapterdoc.cli import main

    root = tmp_path_factory.mktemp("text-on-vl")
    out = {"base_qwen_vl": _base(root, "qwen_vl"), "base_qwen3_5_vl": _base(root, "qwen3_5_vl")}
    out["vl"] = _adapter(tiny_model("qwen_vl"), root / "vl")
    out["vl35"] = _adapter(tiny_model("qwen3_5_vl"), root / "vl35")

    def remap(*args: str) -> None:
        res = CliRunner().invoke(main, ["remap", *args], catch_exceptions=False)
        assert res.exit_code == 0, res.output

    # the language_model strip is the text-style rename TGI needs on Qwen2.5-VL (`remap --for tgi` makes the same
    # one: test_remap_for_tgi_writes_text_keys_on_qwen_vl)
    remap(out["vl"], "--vl", "--out", str(root / "vl-text"))
    out["vl_text"] = str(root / "vl-text")
    # on the hybrid Qwen3.5 stack `remap --for tgi` refuses (AD269: TGI drops q_proj, which the linear-attention
    # layers lack, whatever is added); --vl writes the same text keys
    remap(out["vl35"], "--vl", "--out", str(root / "vl35-tgi"))
    out["vl35_tgi"] = str(root / "vl35-tgi")
    # the same text keys in an adapter whose config names no auto_mapping (other trainers, older PEFT): the base is
    # then built as its own VL class and the profile's text view decides
    bare = root / "vl35-bare"
    shutil.copytree(out["vl35_tgi"], bare)
    cfg = json.loads((bare / "adapter_config.json").read_text())
    cfg.pop("auto_mapping", None)
    (bare / "adapter_config.json").write_text(json.dumps(cfg))
    out["vl35_bare"] = str(bare)
    out["root"] = str(root)
    return out


def _verify(adapter: str, base: str, profile: str, path: str) -> Any:
    from adapterdoc.verify import verify
    from adapterdoc.verify.options import VerifyOptions

    return verify([adapter], base, VerifyOptions(profile=profile, expected_keys=path)).adapters[0]


def _codes(report: Any) -> dict[str, Any]:
    return {f.code: f for f in report.findings}


def _errors(report: Any) -> set[str]:
    return {f.code for f in report.findings if f.severity == "error"}


@pytest.mark.parametrize("path", PATHS)
def test_text_keys_pass_the_key_checks_under_tgi_on_qwen_vl(made: dict[str, str], path: str) -> None:
    """The keys are what TGI reads; the one error left is TGI's own: its qwen2_5_vl class cannot load an adapter
    (AD449: `text_model.model` does not exist, TGI issue #3335)."""
    assert all(".language_model." not in k for k in _keys(made["vl_text"]))
    r = _verify(made["vl_text"], made["base_qwen_vl"], "tgi", path)
    assert r.expected_keys_from == ("registry" if path == "auto" else "meta-device")
    assert _errors(r) == {"AD449"} and (r.missing, r.unexpected) == ([], [])
    assert "text_model.model" in _codes(r)["AD449"].message
    assert r.keys_against == {
        "view": "text",
        "layout": None,
        "model_class": "the language model of Qwen2_5_VLForConditionalGeneration (text-style keys)",
    }
    reads = _codes(r)["AD453"].message
    assert "applies q_proj, v_proj on 2 layer(s) (8 of 8 LoRA tensors)" in reads
    assert "keys checked against the language model of Qwen2_5_VLForConditionalGeneration" in reads


@pytest.mark.parametrize("path", PATHS)
def test_vl_keys_still_fail_under_tgi_with_the_remap_fix(made: dict[str, str], path: str) -> None:
    r = _verify(made["vl"], made["base_qwen_vl"], "tgi", path)
    codes = _codes(r)
    fix = f"adapterdoc remap {made['vl']} --for tgi --out DIR"
    assert not r.ok and {"AD220", "AD221", "AD442"} <= _errors(r)
    assert {codes[c].hint for c in ("AD220", "AD221", "AD442")} == {fix}
    assert "AD223" not in codes and r.move is None  # no registry move to suggest in place of the engine's fix
    assert len(r.unexpected) == 8 and all(".language_model.layers." in k for k in r.unexpected)
    assert r.missing == sorted(k.replace(".language_model.", ".") for k in r.unexpected)
    assert r.keys_against is not None


@pytest.mark.parametrize("path", PATHS)
def test_lorax_reads_the_same_view(made: dict[str, str], path: str) -> None:
    """LoRAX has no qwen2_5_vl class (AD469); the keys themselves pass against the text view."""
    r = _verify(made["vl_text"], made["base_qwen_vl"], "lorax", path)
    assert _errors(r) == {"AD469"} and r.keys_against is not None
    r = _verify(made["vl"], made["base_qwen_vl"], "lorax", path)
    assert {"AD220", "AD221", "AD462"} <= _errors(r)
    assert _codes(r)["AD221"].hint == f"adapterdoc remap {made['vl']} --for lorax --out DIR"


@pytest.mark.parametrize("path", PATHS)
def test_peft_checks_the_model_peft_builds(made: dict[str, str], path: str) -> None:
    """The default profile is unchanged: the VL adapter is clean, the text-keyed one a layout move on the VL
    class (AD223)."""
    r = _verify(made["vl"], made["base_qwen_vl"], "peft", path)
    assert r.ok and r.keys_against is None
    r = _verify(made["vl_text"], made["base_qwen_vl"], "peft", path)
    assert "AD223" in _errors(r) and r.move is not None and r.keys_against is None


@pytest.mark.parametrize("path", PATHS)
def test_the_registry_text_counterpart_names_the_view(made: dict[str, str], path: str) -> None:
    """Qwen3.5-VL's text counterpart is a registry layout (qwen3_5_text): the view is named by it. TGI has no
    qwen3_5 class (AD449) and the hybrid stack lacks q_proj/v_proj in its linear-attention layers (AD443), but
    no key code fires for the text-keyed adapters, and the VL-keyed one fails on its keys."""
    r = _verify(made["vl35_bare"], made["base_qwen3_5_vl"], "tgi", path)
    assert r.expected_keys_from == ("registry" if path == "auto" else "meta-device")
    assert r.keys_against == {
        "view": "text",
        "layout": "qwen3_5_text",
        "model_class": "Qwen3_5ForCausalLM (layout qwen3_5_text, the text model)",
    }
    assert _errors(r) == {"AD443", "AD449"} and (r.missing, r.unexpected) == ([], [])
    # remap --for tgi also names the text class in auto_mapping: the base is built as it (AD115)
    r = _verify(made["vl35_tgi"], made["base_qwen3_5_vl"], "tgi", path)
    assert not _errors(r) & KEY_CODES and "AD115" in _codes(r)
    r = _verify(made["vl35"], made["base_qwen3_5_vl"], "tgi", path)
    assert {"AD220", "AD221", "AD442"} <= _errors(r) and r.keys_against["layout"] == "qwen3_5_text"


def test_the_cli_reports_the_view(made: dict[str, str], cli: Any) -> None:
    for base in (made["base_qwen_vl"], "tiny:qwen_vl"):
        res = cli("verify", made["vl_text"], "--base", base, "--profile", "tgi", "--json")
        d = json.loads(res.stdout)
        errors = {f["code"] for f in d["adapters"][0]["findings"] if f["severity"] == "error"}
        assert res.exit_code == 1 and errors == {"AD449"}, res.stdout
        assert d["adapters"][0]["keys_against"]["view"] == "text"
        res = cli("verify", made["vl"], "--base", base, "--profile", "tgi")
        assert res.exit_code == 1 and f"adapterdoc remap {made['vl']} --for tgi --out DIR" in res.stdout


def test_remap_for_tgi_writes_text_keys_on_qwen_vl(made: dict[str, str], cli: Any) -> None:
    """The registry has no text layout for qwen_vl: TGI's key layout strips `language_model.` as --vl does. The
    command itself refuses (AD270): TGI's qwen2_5_vl class cannot load any adapter today (AD449)."""
    from adapterdoc.engines.base import EngineNeeds
    from adapterdoc.remap import remap

    out = Path(made["root"]) / "vl-for-tgi"
    res = cli("remap", made["vl"], "--for", "tgi", "--base", "tiny:qwen_vl", "--out", str(out))
    assert res.exit_code == 3 and "AD270" in res.output and "text_model.model" in res.output
    assert not out.exists()
    remap(made["vl"], engine="tgi", needs=EngineNeeds(keys="text"), base="tiny:qwen_vl", out=str(out))
    assert _keys(str(out)) == _keys(made["vl_text"])
    assert _errors(_verify(str(out), "tiny:qwen_vl", "tgi", "auto")) == {"AD449"}

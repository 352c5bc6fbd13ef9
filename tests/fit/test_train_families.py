"""`train`, then `eval`, `verify` and `merge`, on tiny transformers-saved folders of families outside the registry
(fixtures/make_families.py) and on a registry family: the merged checkpoint's logits equal PEFT's
``merge_and_unload`` of the same adapter."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")

from adapterdoc.errors import UnsupportedInputError  # noqa: E402
from adapterdoc.train import runtime  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "fixtures" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def fam(tmp_path_factory):
    """``fam.model(name)``: a family folder (or a registry fixture folder) built on first use; ``fam.data``."""
    mf, mm = _load("make_families"), _load("make_models")
    root = tmp_path_factory.mktemp("families")

    class Fam:
        data = mm.write_data(root / "data")

        @staticmethod
        def model(name: str) -> Path:
            if name in mf.FAMILIES:
                return mf.make(root, [name])[name]
            return mm.make(root, [name])[name]

    return Fam


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with runtime.torch_threads(1):
        yield


def _chain(cli, fam, name: str, tmp_path: Path, rows: str = "messages") -> None:
    base, data = fam.model(name), fam.data[rows]
    out = tmp_path / "run"
    res = cli("train", "--base", base, "--data", data, "--out", out, "--steps", "3", "--lr", "5e-3", "--json")
    assert res.exit_code == 0, res.stderr + res.stdout
    d = json.loads(res.stdout)
    assert d["ok"] and d["verify"]["ok"] and d["train_loss"]["after"] < d["train_loss"]["before"]
    v = d["verify"]
    assert v["missing"] == v["unexpected"] == v["shape_mismatch"] == 0
    assert v["lora_b"]["total"] > 0 and v["lora_b"]["nonzero"] == v["lora_b"]["total"]
    adapter = out / "adapter"
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    codes = [f["code"] for f in d["findings"]]
    report = (out / "RUN_REPORT.md").read_text()
    if d["layout"] is None:  # outside the registry: PEFT's all-linear, never the output head; said so
        assert codes == ["AD627"] and "no towers are known" in d["findings"][0]["message"]
        assert "## LoRA targets" in report and "none were excluded" in report
        assert cfg["exclude_modules"] is None
        assert not [t for t in cfg["target_modules"] if t.split(".")[-1] in ("lm_head", "embed_tokens")]
        assert all(t.startswith("model.layers.") for t in cfg["target_modules"])  # PEFT writes the full paths
    else:
        assert "AD627" not in codes and "## LoRA targets" not in report

    ev = cli("eval", adapter, "--base", base, "--data", data, "--json")
    assert ev.exit_code == 0, ev.stderr
    e = json.loads(ev.stdout)
    assert e["adapter"]["loss"] < e["base"]["loss"] and e["base"]["tokens"] == e["adapter"]["tokens"] > 0

    ver = cli("verify", adapter, "--base", base, "--json")
    assert ver.exit_code == 0, ver.stderr + ver.stdout

    merged = tmp_path / "merged"
    mg = cli("merge", adapter, "--base", base, "--out", merged, "--json")
    assert mg.exit_code == 0, mg.stderr + mg.stdout
    assert len(json.loads(mg.stdout)["applied"]) == v["lora_b"]["total"]
    _merged_logits_equal_peft(base, adapter, merged)


def _merged_logits_equal_peft(base: Path, adapter: Path, merged: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([[1, 5, 9, 40, 77, 120, 200, 3]])
    ours = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).eval()
    plain = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    peft = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), adapter
    ).merge_and_unload()
    with torch.no_grad():
        a, b, c = (m.eval()(input_ids=ids).logits for m in (ours, peft, plain))
    assert (b - c).abs().max() > 1e-3  # the adapter changes the logits: the comparison can fail
    assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), float((a - b).abs().max())


@pytest.mark.parametrize("name", ["llama"])
def test_a_family_outside_the_registry_trains_evaluates_verifies_and_merges(cli, fam, tmp_path, name) -> None:
    """Before: `LlamaForCausalLM is not a layout of the registry, so its LoRA targets are unknown` (exit 3)."""
    _chain(cli, fam, name, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen2", "qwen3", "gemma3_text", "phi3", "qwen3_5_text"])
def test_every_fixture_family_and_a_registry_one_go_through_the_chain(cli, fam, tmp_path, name) -> None:
    _chain(cli, fam, name, tmp_path, rows="prompt_completion" if name == "qwen3" else "messages")


def test_targets_outside_the_registry_are_peft_target_modules(cli, fam, tmp_path) -> None:
    res = cli(
        "train", "--base", fam.model("llama"), "--data", fam.data["text"], "--out", tmp_path / "t", "--steps", "1",
        "--targets", "q_proj,v_proj", "--max-length", "32", "--no-canaries", "--json",
    )  # fmt: skip
    assert res.exit_code == 0, res.stderr
    cfg = json.loads((tmp_path / "t" / "adapter" / "adapter_config.json").read_text())
    assert sorted(cfg["target_modules"]) == ["q_proj", "v_proj"]
    assert "from --targets on 4 modules (q_proj, v_proj)" in json.loads(res.stdout)["findings"][0]["message"]


def test_an_encoder_outside_the_registry_is_refused_by_name() -> None:
    import transformers

    from adapterdoc.train.base_model import _check_causal

    _check_causal("x", transformers.LlamaForCausalLM)
    with pytest.raises(
        UnsupportedInputError, match="BertModel is not a layout of the registry and not a causal"
    ):
        _check_causal("x", transformers.BertModel)


def test_the_family_fixtures_are_deterministic_and_small(tmp_path) -> None:
    mf = _load("make_families")
    a, b = mf.make(tmp_path / "a", ["phi3"])["phi3"], mf.make(tmp_path / "b", ["phi3"])["phi3"]
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(names)
    for n in names:
        assert (a / n).read_bytes() == (b / n).read_bytes(), n
    assert sum((a / n).stat().st_size for n in names) < 400_000
    tok_cfg = json.loads((a / "tokenizer_config.json").read_text())
    assert "{% generation %}" not in tok_cfg["chat_template"] and tok_cfg["eos_token"] == "<|end|>"


def test_probe_transformers_reads_a_qwen2_folders_tokenizer_as_its_own_class(fam) -> None:
    """A library fact the fixtures meet: transformers 5 loads a Qwen2 folder's tokenizer as ``Qwen2Tokenizer``
    (from config.json's model_type) although tokenizer_config.json names ``PreTrainedTokenizerFast``, and that
    class pre-tokenizes in its own way: the same text gives other ids than tokenizer.json does. Train and eval both
    load it with AutoTokenizer (and the adapter keeps the tokenizer it was trained with), so they agree."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    folder = fam.model("qwen2")
    tok = AutoTokenizer.from_pretrained(folder)
    raw = Tokenizer.from_file(str(folder / "tokenizer.json"))
    text = 'I want to cancel order 1234, please! {"intent": 1}'
    assert (
        json.loads((folder / "tokenizer_config.json").read_text())["tokenizer_class"]
        == "PreTrainedTokenizerFast"
    )
    assert type(tok).__name__ == "Qwen2Tokenizer"
    assert tok(text, add_special_tokens=False)["input_ids"] != raw.encode(text, add_special_tokens=False).ids

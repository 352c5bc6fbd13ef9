"""``remap --for sglang`` on the adapters SGLang 0.5.23 serves as they are and on the ones it cannot serve exactly:
LoRA on embed_tokens / lm_head (a tied one too) passes through (PEFT's base_layer.weight copy is no modules_to_save);
a copy that differs from the base, and LoRA biases, are refused with exit 3 and nothing written."""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

pytestmark = pytest.mark.ml

TEXT = "ministral3_text"
ADAPTERS: dict[str, tuple[str, dict[str, Any]]] = {
    "embed": (TEXT, dict(target_modules=["embed_tokens", "q_proj", "v_proj"])),
    "lm_head_tied": (TEXT, dict(target_modules=["lm_head", "q_proj", "v_proj"])),
    "lm_head": ("qwen3_moe_text", dict(target_modules=["lm_head", "q_proj", "v_proj"])),
    "bias": (TEXT, dict(target_modules=["q_proj", "v_proj", "o_proj"], lora_bias=True)),
}


@pytest.fixture(scope="module")
def made(tmp_path_factory: Any, tiny_model: Any) -> Callable[[str], Path]:
    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            out = tmp_path_factory.mktemp("rs") / name
            if name == "resized":
                model = tiny_model(TEXT)
                model.resize_token_embeddings(1008)
                layout, kw = TEXT, dict(target_modules=["embed_tokens", "q_proj", "v_proj"])
            else:
                layout, kw = ADAPTERS[name]
                model = tiny_model(layout)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.manual_seed(1)
                cfg = peft.LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, **kw)
                peft.get_peft_model(model, cfg).save_pretrained(str(out))
            cache[name] = out
        return cache[name]

    return get


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("name", ["embed", "lm_head_tied", "lm_head"])
def test_embedding_lora_is_served_as_it_is(
    made: Callable[[str], Path], cli: Any, tmp_path: Path, name: str
) -> None:
    src = made(name)
    layout = ADAPTERS[name][0]
    out = tmp_path / "out"
    r = cli("remap", str(src), "--for", "sglang", "--base", f"tiny:{layout}", "--out", str(out), "--json")
    assert r.exit_code == 0, r.output
    v = cli("verify", str(out), "--profile", "sglang", "--base", f"tiny:{layout}", "--json")
    assert v.exit_code == 0, v.stdout
    assert json.loads(v.stdout)["ok"] is True


@pytest.mark.parametrize(("name", "code"), [("resized", "AD490"), ("bias", "AD492")])
def test_refused_with_nothing_written(
    made: Callable[[str], Path], cli: Any, tmp_path: Path, name: str, code: str
) -> None:
    src = made(name)
    before = _digest(src)
    out = tmp_path / "out"
    r = cli("remap", str(src), "--for", "sglang", "--base", f"tiny:{TEXT}", "--out", str(out))
    assert r.exit_code == 3, r.output
    assert r.stderr.startswith("adapterdoc: error: ") and code in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not out.exists() and _digest(src) == before

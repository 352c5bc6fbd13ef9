"""A tiny real Llama with a word-level tokenizer and a real PEFT LoRA on it (non-zero B), for the probe tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

WORDS = [f"w{i}" for i in range(120)]
"""The tokenizer's words (ids 3..122; 0 unk, 1 bos, 2 eos)."""


def tokenizer(folder: Path) -> None:
    """A word-level fast tokenizer (no BOS added), saved as transformers saves one."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(folder)


def base(folder: Path, seed: int = 0, words: bool = True) -> Path:
    """A 2-layer LlamaForCausalLM (vocab 128, f32), with the word tokenizer when ``words``."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.config.architectures = ["LlamaForCausalLM"]
    model.save_pretrained(folder)
    if words:
        tokenizer(folder)
    return folder


def adapter(base_folder: Path, folder: Path, seed: int = 1, **lora: Any) -> Path:
    """A PEFT LoRA (r=4, alpha 8, q/v/down, B non-zero) on the base in ``base_folder``."""
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model

    model = transformers.AutoModelForCausalLM.from_pretrained(base_folder)
    torch.manual_seed(seed)
    lora.setdefault("r", 4)
    lora.setdefault("lora_alpha", 8)
    lora.setdefault("target_modules", ["q_proj", "v_proj", "down_proj"])
    pm = get_peft_model(model, LoraConfig(init_lora_weights=False, **lora))
    pm.save_pretrained(folder)
    return folder


def trained(base_folder: Path, rows: list[str], out: Path) -> Path:
    """A LoRA trained by ``adapterdoc train`` on ``rows`` (text) for 30 steps: its PEFT adapter folder."""
    import json

    from click.testing import CliRunner

    from adapterdoc.cli import main

    data = out.parent / f"{out.name}-rows.jsonl"
    data.write_text("".join(json.dumps({"text": r}) + "\n" for r in rows))
    args = ["train", "--base", str(base_folder), "--data", str(data), "--out", str(out), "--steps", "30"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    return out / "adapter"


def canaries(adapter: Path, base_folder: Path, rows: list[str], folder: Path) -> Path:
    """``probe --make-canaries`` for ``adapter`` on the base in ``base_folder``, the prompts ``rows`` (written to
    ``folder/prompts.jsonl``): the path of ``folder/canaries.json``."""
    import json

    from click.testing import CliRunner

    from adapterdoc.cli import main

    prompts, out = folder / "prompts.jsonl", folder / "canaries.json"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in rows))
    args = ["probe", "--make-canaries", str(adapter), "--base", str(base_folder), "--out", str(out)]
    r = CliRunner().invoke(main, [*args, "--prompts", str(prompts)])
    assert r.exit_code == 0, r.output
    return out

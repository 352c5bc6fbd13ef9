"""Run in the llama.cpp oracle environment (.ci/oracles/llama_cpp.sh): ``tokenizer DIR`` saves transformers' fast
tokenizer of ``DIR/tokenizer.model`` beside it (the local side of the canaries); ``serve CONFIG PORT SCALE`` runs
llama-cpp-python's stock server app on 127.0.0.1 with CONFIG's models, the default one rebuilt around
``llama_cpp.Llama(..., lora_scale=SCALE)`` when SCALE is not 1 (its settings have no lora_scale)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def spm(folder: str) -> None:
    """A character-level SentencePiece model of the letters a-j (``DIR/tokenizer.model``): every text splits into
    the same pieces under llama.cpp's SPM tokenizer and under the local fast tokenizer (multi-character pieces of a
    unigram model are segmented differently by the two)."""
    import random

    import sentencepiece as sp

    rng = random.Random(0)
    text = Path(folder) / "spm.txt"
    text.write_text(
        "\n".join(
            " ".join(rng.choice("abcdefghij") * rng.randint(1, 4) for _ in range(9)) for _ in range(200)
        )
    )
    sp.SentencePieceTrainer.train(
        input=str(text), model_prefix=f"{folder}/tokenizer", model_type="char", character_coverage=1.0,
        bos_id=1, eos_id=2, unk_id=0, minloglevel=2,
    )  # fmt: skip
    text.unlink()
    (Path(folder) / "tokenizer.vocab").unlink()


def tokenizer(folder: str, bos: str = "bos") -> None:
    """SentencePiece's own pieces and scores as a fast Unigram tokenizer: a "▁" before the text and for each space,
    BOS first (as llama.cpp's SPM tokenizer does); with ``bos`` ``no-bos``, no BOS, and ``add_bos_token`` false in
    tokenizer_config.json (which llama.cpp's converter writes into the GGUF as ``tokenizer.ggml.add_bos_token``)."""
    import sentencepiece as sp
    from tokenizers import Tokenizer, decoders, models, normalizers, processors
    from transformers import PreTrainedTokenizerFast

    spm = sp.SentencePieceProcessor(model_file=f"{folder}/tokenizer.model")
    pieces = [(spm.id_to_piece(i), spm.get_score(i)) for i in range(spm.get_piece_size())]
    tok = Tokenizer(models.Unigram(pieces, unk_id=spm.unk_id()))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Metaspace()
    piece = spm.id_to_piece(spm.bos_id())
    if bos == "bos":
        tok.post_processor = processors.TemplateProcessing(
            single=f"{piece} $A", special_tokens=[(piece, spm.bos_id())]
        )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=piece, eos_token=spm.id_to_piece(spm.eos_id()), unk_token="<unk>"
    )
    fast.save_pretrained(folder)
    if bos != "bos":
        config = Path(folder) / "tokenizer_config.json"
        config.write_text(json.dumps({**json.loads(config.read_text()), "add_bos_token": False}))


def serve(config: str, port: str, scale: str) -> None:
    import llama_cpp
    import uvicorn
    from llama_cpp.server import app as server
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    models = [ModelSettings(**m) for m in json.loads(Path(config).read_text())]
    app = server.create_app(
        server_settings=ServerSettings(host="127.0.0.1", port=int(port)), model_settings=models
    )
    if float(scale) != 1.0:
        proxy = server._llama_proxy
        assert proxy is not None and proxy._current_model is not None
        proxy._current_model.close()
        first = models[0]
        proxy._current_model = llama_cpp.Llama(
            model_path=first.model, lora_path=first.lora_path, lora_scale=float(scale), logits_all=True,
            n_ctx=first.n_ctx, n_threads=first.n_threads, seed=first.seed, verbose=False,
        )  # fmt: skip
    uvicorn.run(app, host="127.0.0.1", port=int(port), log_level="warning")


if __name__ == "__main__":
    {"spm": spm, "tokenizer": tokenizer, "serve": serve}[sys.argv[1]](*sys.argv[2:])

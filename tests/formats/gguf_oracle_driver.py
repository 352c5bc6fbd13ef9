"""Runs llama.cpp's own code inside the llama_cpp oracle environment (.ci/oracles/llama_cpp.sh); called by
test_gguf_oracle.py as ``ENV/bin/python gguf_oracle_driver.py COMMAND ...``.

- ``spm OUT_DIR``: a tiny SentencePiece ``tokenizer.model`` trained offline (llama.cpp's converter needs a tokenizer;
  token ids are fed directly, so its content does not matter).
- ``base MODEL_DIR OUT.gguf``: llama.cpp's ``convert_hf_to_gguf.py --outtype f32``. Families whose converter takes
  the BPE path (Qwen3-MoE, Qwen3.5) refuse a home-made BPE tokenizer by hash ("BPE pre-tokenizer was not
  recognized"), so this driver makes every converter class read the SentencePiece model instead: the vocabulary
  only, the tensors are converted by llama.cpp's code untouched.
- ``lora ADAPTER_DIR BASE_DIR OUT.gguf``: llama.cpp's ``convert_lora_to_gguf.py --outtype f32``.
- ``logits BASE.gguf LORA.gguf|- IDS OUT.npy [f32]``: ``Llama(model_path, lora_path, logits_all=True).eval(ids)``
  (``f32``: K and V cached in f32 instead of llama.cpp's default f16, whose rounding (2^-11 relative) is most of
  llama.cpp's distance from transformers on these tiny models). Only
  for adapters llama.cpp accepts: llama-cpp-python 0.3.36 does not see a refusal (``llama_adapter_lora_init``'s
  ctypes result type is ``POINTER(c_void_p)``, so its NULL is not ``None``), hands the NULL adapter to
  ``llama_set_adapters_lora`` and the process dies by SIGSEGV reserving the first graph.
- ``load BASE.gguf LORA.gguf...``: the base loaded once (``Llama(model_path)``), then llama.cpp's own
  ``llama_adapter_lora_init`` on each adapter, its log captured with ``llama_log_set``; prints one JSON line per
  adapter, ``{"path", "loaded", "errors"}`` (``errors``: llama.cpp's ERROR-level log lines while loading it).
  A check that llama.cpp enforces by ``GGML_ASSERT`` aborts the process instead (SIGABRT, the assert on stderr).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

LLAMA_CPP = (
    Path(sys.prefix) / "llama.cpp"
)  # the environment's own folder (.ci/oracles/llama_cpp.sh puts them there)


def _converters() -> None:
    sys.path.insert(0, str(LLAMA_CPP))
    sys.path.insert(0, str(LLAMA_CPP / "gguf-py"))


def spm(out: str) -> None:
    import random

    import sentencepiece as sp

    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 6))) for _ in range(300)]
    text = Path(out) / "spm.txt"
    text.write_text("\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(400)))
    sp.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(Path(out) / "tokenizer"), vocab_size=100, model_type="unigram",
        character_coverage=1.0, hard_vocab_limit=False, bos_id=1, eos_id=2, unk_id=0, minloglevel=2,
    )  # fmt: skip
    text.unlink()
    (Path(out) / "tokenizer.vocab").unlink()


def _patch_classes(vocab: bool) -> None:
    """Wrap llama.cpp's ``get_model_class``: each converter class as it is, plus ``no_mtp`` where the class exports
    MTP layers (convert_hf_to_gguf.py's own ``--no-mtp``; convert_lora_to_gguf.py has no such flag and asserts on a
    config without MTP layers) and, for the base, the SentencePiece vocabulary (``vocab``)."""
    import conversion

    original = conversion.get_model_class

    def wrapped(name: str, mmproj: bool = False):  # type: ignore[no-untyped-def]
        cls = original(name, mmproj=mmproj)
        if mmproj:
            return cls
        attrs: dict[str, object] = {"model_arch": cls.model_arch}
        if getattr(cls, "supports_mtp_export", False):
            attrs["no_mtp"] = True
        if vocab:

            def set_vocab(self):  # type: ignore[no-untyped-def]
                if hasattr(
                    self, "impl"
                ):  # a dispatching class (Mistral3Model): its implementation writes the file
                    return self.impl.set_vocab()
                return self._set_vocab_sentencepiece()

            attrs["set_vocab"] = set_vocab
        return type(cls.__name__, (cls,), attrs)

    conversion.get_model_class = wrapped


def base(model_dir: str, out: str) -> None:
    _converters()
    _patch_classes(vocab=True)
    import convert_hf_to_gguf as conv

    sys.argv = ["convert_hf_to_gguf.py", model_dir, "--outfile", out, "--outtype", "f32"]
    conv.main()


def lora(adapter: str, base_dir: str, out: str) -> None:
    import runpy

    _converters()
    _patch_classes(vocab=False)
    sys.argv = ["convert_lora_to_gguf.py", adapter, "--base", base_dir, "--outfile", out, "--outtype", "f32"]
    runpy.run_path(str(LLAMA_CPP / "convert_lora_to_gguf.py"), run_name="__main__")


GGML_TYPE_F32 = 0
"""ggml.h's ``enum ggml_type`` F32 (llama-cpp-python's ``type_k``/``type_v``; llama.cpp's default KV cache is F16)."""


def logits(base_gguf: str, lora_gguf: str, ids: str, out: str, kv: str = "f16") -> None:
    import numpy as np
    from llama_cpp import Llama

    tokens = [int(t) for t in ids.split(",")]
    cache = {"type_k": GGML_TYPE_F32, "type_v": GGML_TYPE_F32} if kv == "f32" else {}
    try:
        llm = Llama(
            model_path=base_gguf, lora_path=None if lora_gguf == "-" else lora_gguf, logits_all=True,
            n_ctx=64, n_batch=64, n_threads=2, verbose=True, seed=0, **cache,
        )  # fmt: skip
    except Exception as e:  # llama-cpp-python raises on a refused adapter; llama.cpp logged why on stderr
        print(f"LOAD-FAILED: {e}", flush=True)
        sys.exit(3)
    llm.eval(tokens)
    np.save(out, np.array(llm.scores[: len(tokens)], dtype=np.float32))


GGML_LOG_LEVEL_ERROR = 4
"""ggml.h's ``enum ggml_log_level`` (NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5). llama-cpp-python 0.3.36's
``_logger`` still maps the older enum (3 → ERROR, 4 → DEBUG): with ``verbose=False`` it prints llama.cpp's warnings
and hides its errors, so the refusal's reason is read here from the log callback, not from stderr."""


def load(base_gguf: str, *loras: str) -> None:
    import ctypes
    import json

    import llama_cpp
    from llama_cpp import Llama

    llm = Llama(model_path=base_gguf, n_ctx=64, n_batch=64, n_threads=2, verbose=False)
    lines: list[tuple[int, str]] = []

    @llama_cpp.llama_log_callback
    def on_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        lines.append((level, text.decode("utf-8", "replace")))

    llama_cpp.llama_log_set(on_log, ctypes.c_void_p(0))
    for path in loras:
        lines.clear()
        adapter = llama_cpp.llama_adapter_lora_init(llm._model.model, path.encode())
        errors = [t.strip() for level, t in lines if level == GGML_LOG_LEVEL_ERROR]
        print(json.dumps({"path": path, "loaded": bool(adapter), "errors": errors}), flush=True)
        if adapter:
            llama_cpp.llama_adapter_lora_free(adapter)


if __name__ == "__main__":
    os.environ.pop("NO_LOCAL_GGUF", None)  # the converters then use their own gguf-py
    {"spm": spm, "base": base, "lora": lora, "logits": logits, "load": load}[sys.argv[1]](*sys.argv[2:])

"""Reads llama.cpp's own converter package (``conversion/``, from ``convert_hf_to_gguf.py``): for each Hugging Face
class named on the command line, which converter class ``get_model_class`` returns, its ``model_arch``, whether
LlamaModel's q/k permutation applies (``undo_permute``), and which classes of its MRO define ``modify_tensors``.
Run as ``PYTHON gguf_families_driver.py LLAMA_CPP_DIR CLASS...``; prints one JSON object. Used by
test_gguf_families_oracle.py with the llama_cpp oracle environment (its ``llama.cpp`` folder)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path


def main(root: str, classes: list[str]) -> None:
    sys.path.insert(0, str(Path(root)))
    sys.path.insert(0, str(Path(root) / "gguf-py"))
    logging.disable(logging.CRITICAL)
    import conversion
    from conversion.llama import LlamaModel

    out: dict[str, object] = {}
    for name in classes:
        try:
            cls = conversion.get_model_class(name)
        except (NotImplementedError, KeyError) as e:
            out[name] = {"error": str(e)}
            continue
        owners = [
            k.__name__ for k in cls.__mro__ if "modify_tensors" in k.__dict__ and k.__name__ != "ModelBase"
        ]
        llama_permute = issubclass(cls, LlamaModel) and bool(getattr(cls, "undo_permute", False))
        out[name] = {"arch": cls.model_arch.name, "class": cls.__name__, "llama_permute": llama_permute,
                     "modify_tensors": owners}  # fmt: skip
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

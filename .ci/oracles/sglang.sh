#!/usr/bin/env bash
# The SGLang oracle: SGLang 0.5.23's own LoRA-loading code (sglang.srt.lora.*) importable on a CPU-only machine.
#
# sglang is installed with --no-deps (its full requirements are CUDA kernels and a serving stack); beside it go CPU
# torch 2.13.0, transformers 5.19.0 (the version sglang pins) and the light packages that the import chain of
# sglang.srt.lora.lora_manager reaches (triton imports without a GPU). The two imports that cannot work here,
# torchvision and tvm_ffi, are stubbed at run time by scripts/sglang_oracle.py (STUBS says why).
# Idempotent: with the environment in place and its stamp matching, it does nothing.
set -euo pipefail
root="${ADAPTERDOC_ORACLES:-/opt/adapterdoc-oracles}"
env="$root/sglang"
stamp="sglang==0.5.23 transformers==5.19.0 torch==2.13.0 v2"
if [ -x "$env/bin/python" ] && [ "$(cat "$env/.adapterdoc-stamp" 2>/dev/null)" = "$stamp" ]; then
    exit 0
fi
rm -rf "$env"
mkdir -p "$root"
python3.11 -m venv "$env" 2>/dev/null || python3 -m venv "$env"
pip=("$env/bin/python" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" torch==2.13.0
"${pip[@]}" transformers==5.19.0 safetensors huggingface_hub numpy
# the light import chain of sglang.srt.lora (pure Python or small wheels, no CUDA)
"${pip[@]}" msgspec pydantic orjson psutil requests packaging tqdm regex setproctitle pyzmq einops \
    pybase64 partial_json_parser uvloop aiohttp fastapi uvicorn python-multipart prometheus-client interegular \
    pillow sentencepiece tiktoken xxhash zstandard dill blobfile==3.0.0 scipy ipython loguru gguf openai==2.8.0 \
    triton==3.8.0
"${pip[@]}" --no-deps compressed-tensors==0.18.0
"${pip[@]}" --no-deps sglang==0.5.23
echo "$stamp" >"$env/.adapterdoc-stamp"

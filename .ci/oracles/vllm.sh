#!/usr/bin/env bash
# vLLM 0.33.0's own LoRA-loading code on the CPU: the oracle for `verify --profile vllm` and `remap --for vllm`
# (tests/oracles/test_vllm_oracle.py runs scripts/vllm_oracle.py in this environment).
# Builds "$ADAPTERDOC_ORACLES/vllm" (default /opt/adapterdoc-oracles/vllm); idempotent: a built env is left alone.
# torch is this disk's CPU wheel (vLLM's own pin, 2.14.0, is CUDA-only here); vLLM itself goes in with --no-deps
# and only the light packages its import chain for vllm.lora.* and the model classes' mappings needs come after.
set -euo pipefail
root="${ADAPTERDOC_ORACLES:-/opt/adapterdoc-oracles}"
env="$root/vllm"
stamp="$env/.adapterdoc-built-v1"
[ -e "$stamp" ] && exit 0
mkdir -p "$root"
rm -rf "$env"
python3 -m venv "$env"
pip=("$env/bin/python" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" torch==2.13.0
"${pip[@]}" --no-deps vllm==0.33.0
"${pip[@]}" 'transformers>=5.16.1,<5.21.0' 'huggingface_hub>=1.31.0' 'tokenizers>=0.23.2' 'safetensors>=0.6.2' \
    numpy regex cachetools psutil tqdm requests filelock pyyaml typing_extensions pydantic msgspec cloudpickle \
    blake3 py-cpuinfo einops pyzmq sentencepiece protobuf 'peft==0.21.2'
"$env/bin/python" -c 'import vllm.lora.peft_helper, vllm.lora.lora_model'
touch "$stamp"

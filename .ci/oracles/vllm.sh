#!/usr/bin/env bash
# vLLM 0.33.0's own LoRA-loading code on the CPU: the oracle for `verify --profile vllm` and `remap --for vllm`
# (tests/oracles/test_vllm_oracle.py runs scripts/vllm_oracle.py in this environment).
# Builds "$ADAPTERDOC_ORACLES/vllm" (default /opt/adapterdoc-oracles/vllm); idempotent: a built env is left alone.
# torch is the CPU wheel this disk holds (vLLM's own pin, 2.14.0, is a CUDA build); vLLM goes in with --no-deps, then
# only the light packages the import chain of vllm.lora.{peft_helper,lora_model,worker_manager,model_manager} and
# of the model classes' modules needs. One import is stubbed: torchvision (PyPI's wheel needs a CUDA torch: on the
# CPU torch it fails with "operator torchvision::nms does not exist"; transformers' image utilities, imported by
# vLLM's Qwen-VL model files, only import names from it, and LoRA loading runs no image transform).
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
"${pip[@]}" --no-deps vllm==0.33.0 compressed-tensors==0.17.0
"${pip[@]}" 'transformers>=5.16.1,<5.21.0' 'huggingface_hub>=1.31.0' 'tokenizers>=0.23.2' 'safetensors>=0.6.2' \
    numpy regex cachetools psutil tqdm requests filelock pyyaml typing_extensions pydantic msgspec cloudpickle \
    blake3 py-cpuinfo einops pyzmq sentencepiece protobuf 'peft==0.21.2' cbor2 aiohttp openai openai-harmony \
    pillow pybase64 uvloop prometheus_client xgrammar fastapi partial_json_parser llguidance loguru \
    "mistral_common>=1.11.6"
site="$("$env/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
mkdir -p "$site/torchvision"
cp "$(dirname "$0")/vllm_torchvision_stub.py" "$site/torchvision/__init__.py"
(cd / && "$env/bin/python" -c 'import vllm.lora.worker_manager, vllm.lora.model_manager, vllm.model_executor.models.qwen3_5')
touch "$stamp"

#!/usr/bin/env bash
# The Action's install step: adapterdoc's base package with the gguf extra (verify's static checks need no torch; a
# GGUF adapter's tensors are read with numpy and gguf-py); with ADAPTERDOC_ML "true", torch first (the CPU build by
# default), then adapterdoc with the ml and gguf extras.
#
# Inputs arrive as environment variables (action.yml passes each through `env:`; nothing is interpolated into this
# script):
#   ADAPTERDOC_ML               "true": install the ml extra                  (default: false)
#   ADAPTERDOC_TORCH_SPEC       pip requirement for torch                      (default: torch)
#   ADAPTERDOC_TORCH_INDEX_URL  index for the torch install; empty: pip's own  (default: PyTorch's CPU wheel index)
#   ADAPTERDOC_PIP_ARGS         extra pip arguments for the torch install, split on whitespace (no quoting)
#   ADAPTERDOC_SOURCE           what to install as adapterdoc                  (default: this repository)
# `python` is the interpreter on PATH (actions/setup-python's). Torch goes first, from its own index, so that the
# second install finds it satisfied and never pulls PyPI's multi-gigabyte CUDA build.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
torch_spec="${ADAPTERDOC_TORCH_SPEC-torch}"
index_url="${ADAPTERDOC_TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}"
source_dir="${ADAPTERDOC_SOURCE:-$(dirname "$(dirname "$here")")}"
read -r -a extra <<< "${ADAPTERDOC_PIP_ARGS-}"

if [ "${ADAPTERDOC_ML-false}" != "true" ]; then
    python -m pip install --disable-pip-version-check "${source_dir}[gguf]"
    exit 0
fi

cmd=(python -m pip install --disable-pip-version-check)
if [ -n "$index_url" ]; then cmd+=(--index-url "$index_url"); fi
cmd+=("${extra[@]}" "${torch_spec:-torch}")
"${cmd[@]}"
python -m pip install --disable-pip-version-check "${source_dir}[ml,gguf]"

#!/usr/bin/env bash
# mlx-lm's own code as the MLX oracle: a virtualenv with mlx (CPU build) and mlx-lm, idempotent.
# The oracle tests run PEFT in adapterdoc's own environment and mlx-lm here, and compare the logits written to files,
# so this environment needs no torch.
set -euo pipefail
root="${ADAPTERDOC_ORACLES:-/opt/adapterdoc-oracles}"
env="$root/mlx"
if [ -x "$env/bin/python" ] && "$env/bin/python" -c "import mlx.core, mlx_lm, safetensors, numpy" 2>/dev/null; then
    exit 0
fi
mkdir -p "$root"
python -m venv "$env"
"$env/bin/python" -m pip install --quiet --disable-pip-version-check "mlx[cpu]" mlx-lm safetensors numpy
"$env/bin/python" -c "import mlx.core, mlx_lm; print('mlx oracle:', mlx_lm.__version__)"

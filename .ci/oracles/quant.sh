#!/usr/bin/env bash
# The quantization libraries as the oracle for quantized bases, idempotent: a virtualenv with compressed-tensors and
# bitsandbytes that sees the running interpreter's torch and transformers (--system-site-packages), so nothing heavy
# is installed twice and neither library lands in adapterdoc's own environment. fixtures/make_quantized.py runs here
# (tests/quant/test_quant_detect_real.py).
set -euo pipefail
ct=0.20.1
bnb=0.50.2
root="${ADAPTERDOC_ORACLES:-/opt/adapterdoc-oracles}"
env="$root/quant"
ready() {
    [ -x "$env/bin/python" ] &&
        "$env/bin/python" -c "import importlib.metadata as md, torch, transformers, safetensors, numpy
assert md.version('compressed-tensors') == '$ct', md.version('compressed-tensors')
assert md.version('bitsandbytes') == '$bnb', md.version('bitsandbytes')" 2>/dev/null
}
if ready; then
    exit 0
fi
mkdir -p "$root"
python -m venv --system-site-packages "$env"
"$env/bin/python" -m pip install --quiet --disable-pip-version-check "compressed-tensors==$ct" "bitsandbytes==$bnb"
ready || { echo "quant oracle: environment incomplete" >&2; exit 1; }
"$env/bin/python" -c "import importlib.metadata as md
print('quant oracle: compressed-tensors', md.version('compressed-tensors'), 'bitsandbytes', md.version('bitsandbytes'))"

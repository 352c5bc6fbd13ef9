#!/usr/bin/env bash
# PEFT 0.18 as the writer of old-layout fused-expert adapters, idempotent: a virtualenv with peft==0.18.1 (no
# dependencies of its own: it sees the running interpreter's torch, transformers, safetensors ... through a .pth file
# appended after its own site directory, as .ci/oracles/llama_cpp.sh does, so its peft wins over the parent's).
# PEFT 0.18 reads a 3-D expert parameter [E, d1, d2] as [E, in, out]; PEFT >= 0.19.1 swaps in and out for the
# parameters transformers does not mark `is_transposed` (tests/verify/test_peft018_experts.py,
# tests/remap/test_peft018_experts.py).
set -euo pipefail
version=0.18.1
root="${ADAPTERDOC_ORACLES:-/opt/adapterdoc-oracles}"
env="$root/peft018"
ready() {
    [ -x "$env/bin/python" ] &&
        "$env/bin/python" -c "import peft, torch, transformers, safetensors
assert peft.__version__ == '$version', peft.__version__" 2>/dev/null
}
if ready; then
    exit 0
fi
mkdir -p "$root"
python -m venv "$env"
"$env/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "peft==$version"
# the parent interpreter's site directories, after the environment's own (its peft wins)
purelib="$("$env/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
python - "$purelib/_adapterdoc_parent_site.pth" <<'EOF'
import site, sys
dirs = [d for d in site.getsitepackages() + [site.getusersitepackages()] if d]
with open(sys.argv[1], "w") as f:
    f.writelines(f"import site; site.addsitedir({d!r})\n" for d in dirs)
EOF
ready || { echo "peft018 oracle: environment incomplete" >&2; exit 1; }
"$env/bin/python" -c "import peft; print('peft018 oracle:', peft.__version__, peft.__file__)"

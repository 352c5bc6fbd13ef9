#!/usr/bin/env bash
# llama.cpp's own code as the GGUF oracle, idempotent: a virtualenv with llama-cpp-python (its llama.cpp, built from
# the source distribution: no wheel exists for this platform; pip caches the built wheel, so only the first build is
# long: ~48 min on a loaded 2-core machine, see docs/runtimes.md) and sentencepiece, plus llama.cpp's Python
# converters (convert_hf_to_gguf.py, convert_lora_to_gguf.py, conversion/, gguf-py/) unpacked from the same source
# distribution into "$env/llama.cpp". The converters need torch and transformers: the environment sees the running
# interpreter's packages through a .pth file appended after its own (as tests/conftest.py's WheelVenv does), so
# nothing heavy is installed twice.
set -euo pipefail
version=0.3.36
root="${ADAPTERDOC_ORACLES:-/opt/adapterdoc-oracles}"
env="$root/llama_cpp"
ready() {
    [ -x "$env/bin/python" ] && [ -f "$env/llama.cpp/convert_lora_to_gguf.py" ] &&
        "$env/bin/python" -c "import llama_cpp, sentencepiece, numpy, torch, transformers
assert llama_cpp.__version__ == '$version', llama_cpp.__version__" 2>/dev/null
}
# llama-cpp-python's server (`llama_cpp.server`, pure Python) for the probe's tests (tests/probe): added to an
# environment built before without them, never a reason to rebuild llama.cpp
server_packages=(fastapi uvicorn sse-starlette starlette-context pydantic-settings)
server_ready() {
    "$env/bin/python" -c "import fastapi, uvicorn, sse_starlette, starlette_context, pydantic_settings" 2>/dev/null
}
add_server() {
    server_ready || "$env/bin/python" -m pip install --quiet --disable-pip-version-check "${server_packages[@]}"
}
if ready; then
    add_server
    exit 0
fi
mkdir -p "$root"
python -m venv "$env"
start=$(date +%s)
"$env/bin/python" -m pip install --quiet --disable-pip-version-check "llama-cpp-python==$version" sentencepiece numpy
echo "llama_cpp oracle: llama-cpp-python installed in $(($(date +%s) - start)) s"
# the parent interpreter's site directories, after the environment's own (its numpy and sentencepiece win)
purelib="$("$env/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
python - "$purelib/_adapterdoc_parent_site.pth" <<'EOF'
import site, sys
dirs = [d for d in site.getsitepackages() + [site.getusersitepackages()] if d]
with open(sys.argv[1], "w") as f:
    f.writelines(f"import site; site.addsitedir({d!r})\n" for d in dirs)
EOF
# llama.cpp's converters, from the same source distribution (pip's cache holds it after the install above)
sdist="$(mktemp -d)"
trap 'rm -rf "$sdist"' EXIT
"$env/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
    "llama-cpp-python==$version" -d "$sdist"
rm -rf "$env/llama.cpp"
mkdir -p "$env/llama.cpp"
tar -xzf "$sdist"/llama_cpp_python-"$version".tar.gz -C "$sdist"
src="$sdist/llama_cpp_python-$version/vendor/llama.cpp"
cp -r "$src/convert_hf_to_gguf.py" "$src/convert_lora_to_gguf.py" "$src/conversion" "$src/gguf-py" "$env/llama.cpp/"
add_server
ready && server_ready || { echo "llama_cpp oracle: environment incomplete" >&2; exit 1; }
"$env/bin/python" -c "import llama_cpp; print('llama_cpp oracle:', llama_cpp.__version__)"

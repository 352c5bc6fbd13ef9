#!/usr/bin/env bash
# The Action's verify step: `adapterdoc verify` with the Action's inputs, every value passed as one quoted argument.
#
# Inputs arrive as environment variables (action.yml passes each through `env:`):
#   ADAPTERDOC_ADAPTERS        adapters (PEFT or mlx-lm folders, GGUF LoRA files): one per line, or
#                              space-separated on one line; glob patterns (adapters/*) expand, a path with spaces
#                              needs a line of its own. A glob's match that is a model GGUF (not an adapter) is
#                              left out, as the pre-commit hook leaves it out; a path named as such goes to verify.
#   ADAPTERDOC_BASE            --base (empty: [tool.adapterdoc] base, else each adapter's own base)
#   ADAPTERDOC_PROFILE         --profile (empty: [tool.adapterdoc] profile, else peft)
#   ADAPTERDOC_MAX_LORA_RANK   --max-lora-rank (empty: [tool.adapterdoc] or 16)
#   ADAPTERDOC_FORMAT          --format on stdout (default github: annotations on the pull request)
#   ADAPTERDOC_OUTPUT_FILE     --output-file: the --format report goes to this file INSTEAD of stdout
#   ADAPTERDOC_JUNIT_FILE      --junit-file: also a JUnit XML here, beside the annotations
# Nothing is evaluated: a value is an argument, never shell code.
set -euo pipefail

# A *.gguf file whose header reads as a model, not a LoRA adapter (adapterdoc.precommit.is_model_gguf: header only).
is_model_gguf() {
    [[ "$1" == *.gguf ]] || return 1
    python -c 'import sys; from adapterdoc.precommit import is_model_gguf; sys.exit(0 if is_model_gguf(sys.argv[1]) else 1)' "$1"
}

adapters=()
if [[ "${ADAPTERDOC_ADAPTERS-}" == *$'\n'* ]]; then
    mapfile -t words <<< "${ADAPTERDOC_ADAPTERS}"
else
    read -r -a words <<< "${ADAPTERDOC_ADAPTERS-}"
fi
for word in "${words[@]}"; do
    word="${word#"${word%%[![:space:]]*}"}"   # trim the indentation of a YAML block
    word="${word%"${word##*[![:space:]]}"}"
    [ -n "$word" ] || continue
    if [[ "$word" == *[*?[]* ]] && compgen -G "$word" > /dev/null; then
        # compgen lists matches in the directory's order: sort them (bytes, whatever the locale) for a stable run
        while IFS= read -r match; do
            if is_model_gguf "$match"; then
                echo "adapterdoc: $match is a model GGUF, not an adapter: left out of '$word'" >&2
                continue
            fi
            adapters+=("$match")
        done < <(compgen -G "$word" | LC_ALL=C sort)
    else
        adapters+=("$word")
    fi
done
if [ "${#adapters[@]}" -eq 0 ]; then
    echo "adapterdoc: error: the action's 'adapters' input names no adapter folder" >&2
    exit 3
fi

args=(verify --format "${ADAPTERDOC_FORMAT:-github}")
if [ -n "${ADAPTERDOC_BASE-}" ]; then args+=(--base "$ADAPTERDOC_BASE"); fi
if [ -n "${ADAPTERDOC_PROFILE-}" ]; then args+=(--profile "$ADAPTERDOC_PROFILE"); fi
if [ -n "${ADAPTERDOC_MAX_LORA_RANK-}" ]; then args+=(--max-lora-rank "$ADAPTERDOC_MAX_LORA_RANK"); fi
if [ -n "${ADAPTERDOC_OUTPUT_FILE-}" ]; then args+=(--output-file "$ADAPTERDOC_OUTPUT_FILE"); fi
if [ -n "${ADAPTERDOC_JUNIT_FILE-}" ]; then args+=(--junit-file "$ADAPTERDOC_JUNIT_FILE"); fi
export NO_COLOR=1
exec python -m adapterdoc "${args[@]}" -- "${adapters[@]}"

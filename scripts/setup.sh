#!/usr/bin/env bash
# Set up InfScaler-Edge on a fresh machine: a virtual environment in .venv with the
# package (editable) and the extras named in $INFSCALER_EXTRAS (default: dev).
# Idempotent: a second run only re-checks the install.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
EXTRAS=${INFSCALER_EXTRAS:-dev}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install --quiet -e ".[${EXTRAS}]"

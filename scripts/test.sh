#!/usr/bin/env bash
# The tests: install into their own environment, then run the suite (CPU only, offline).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh .venv-test dev
.venv-test/bin/python -m pytest tests

#!/usr/bin/env bash
# The tests: install into their own environment, then run the suite (CPU only, offline).
set -euo pipefail
cd "$(dirname "$0")/.."
# the report's test opens it in Debian's headless chromium (driven by playwright); where this
# script may install packages (root with apt), it does, beside the Python install; elsewhere
# that test skips, saying why
apt_job=""
if ! command -v chromium >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "warning: could not install chromium; the report's browser test will skip" >&2 &
  apt_job=$!
fi
bash scripts/setup-venv.sh .venv-test dev
if [ -n "$apt_job" ]; then wait "$apt_job"; fi
.venv-test/bin/python -m pytest tests --durations=25

#!/usr/bin/env bash
# The tests: install into their own environment, then run the suite (CPU only, offline).
#   bash scripts/test.sh            everything (what CI runs)
#   bash scripts/test.sh --fast     the quick tier for the edit-test loop: no whole runs (-m "not slow")
#   bash scripts/test.sh [--fast] ARGS...   further pytest arguments (a file, -k EXPR)
set -euo pipefail
tier=()
if [ "${1:-}" = "--fast" ]; then tier=(-m "not slow"); shift; fi
cd "$(dirname "$0")/.."
# the report's test opens it in Debian's headless chromium (driven by playwright); where this
# script may install packages (root with apt), it does, beside the Python install; elsewhere
# that test skips, saying why
apt_job="" start=$SECONDS
if ! command -v chromium >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "warning: could not install chromium; the report's browser test will skip" >&2 &
  apt_job=$!
fi
bash scripts/setup-venv.sh .venv-test dev
# OpenEnv's Environment API for the openenv adapter's tests, without its web UI: openenv-core
# requires gradio (a minute and 300 MB more to install), which it imports only where present;
# its interfaces import fastapi and fastmcp (the dev extra; fastmcp 3, since verifiers 0.2 needs mcp < 2)
.venv-test/bin/python -m pip install -q --no-deps "openenv-core>=0.3,<0.4" 2>&1 | grep -v "^WARNING: Location" || true
pip_s=$((SECONDS - start))
if [ -n "$apt_job" ]; then wait "$apt_job"; fi
# what bounds the install (the two run side by side): said once, before the tests
echo "install: the Python packages in ${pip_s} s; ready for the tests at $((SECONDS - start)) s${apt_job:+ (chromium alongside)}" >&2
# two test processes (pytest-xdist), a file's tests in one of them: a file's tests share its
# fixtures, and the Ray cluster tests never run beside each other. Each test's seconds and
# worker go to .test-home/test-times.jsonl (python scripts/test_profile.py FILE: where the time went)
.venv-test/bin/python -m pytest tests -n 2 --dist loadfile --durations=25 --times .test-home/test-times.jsonl \
  "${tier[@]}" "$@"

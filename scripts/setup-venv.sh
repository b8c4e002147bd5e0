#!/usr/bin/env bash
# Create a virtual environment at $1 and install evotrainer into it, with extras $2.
# The CPU path pins torch through constraints-cpu.txt (an unpinned torch pulls a CUDA build).
# pip compiles every module's bytecode as it installs: a job's sandbox may not write bytecode,
# so a module left to compile on first import compiles again in every job that imports it
# (from clean clones the same day: --no-compile left the install at 122 s and added 19 s to the tests).
set -euo pipefail
venv=${1:?usage: setup-venv.sh VENV [EXTRAS]}
extras=${2:-}
cd "$(dirname "$0")/.."
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
"$venv/bin/python" -m pip install -q -c constraints-cpu.txt "torch==2.13.0" 2>&1 | grep -v "^WARNING: Location" || true
"$venv/bin/python" -m pip install -q -c constraints-cpu.txt -e ".${extras:+[$extras]}" 2>&1 | grep -v "^WARNING: Location" || true
"$venv/bin/python" -c "import evotrainer, torch; print('evotrainer', evotrainer.__version__, 'torch', torch.__version__)"

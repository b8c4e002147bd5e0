#!/usr/bin/env bash
# Create a virtual environment at $1 and install evotrainer into it, with extras $2.
# The CPU path pins torch through constraints-cpu.txt (an unpinned torch pulls a CUDA build).
# No bytecode at install (--no-compile): of the ~32,000 modules the dev extra installs, the tests
# import ~9,000 and a job ~2,500, and compiling all of them took pip about a minute of CPU.
# Python compiles a module on its first import instead; what every job imports (the fork
# server's preload) is compiled here, since a job's sandbox may not write it.
set -euo pipefail
venv=${1:?usage: setup-venv.sh VENV [EXTRAS]}
extras=${2:-}
cd "$(dirname "$0")/.."
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --no-compile --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
"$venv/bin/python" -m pip install -q --no-compile -c constraints-cpu.txt "torch==2.13.0" 2>&1 | grep -v "^WARNING: Location" || true
"$venv/bin/python" -m pip install -q --no-compile -c constraints-cpu.txt -e ".${extras:+[$extras]}" 2>&1 | grep -v "^WARNING: Location" || true
env -u PYTHONDONTWRITEBYTECODE "$venv/bin/python" -c "import importlib, evotrainer, torch
from evotrainer.executors.worker import PRELOAD
for module in PRELOAD: importlib.import_module(module)
print('evotrainer', evotrainer.__version__, 'torch', torch.__version__)"

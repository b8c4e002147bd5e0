#!/usr/bin/env bash
# The main job: install, build the base checkpoint (cached), train the reference recipe.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh .venv
.venv/bin/evotrainer pretrain --task arith
.venv/bin/evotrainer train --task arith --steps 300 --seed 0 --out runs/reference-arith-s0

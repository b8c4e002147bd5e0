#!/usr/bin/env bash
# The main job: install, then the quickstart (configs/quickstart.yaml): build the base
# (cached), run the evolution loop, and replay its winner beside the reference recipe on
# fresh seeds; prints the table of base, reference and evolved. Each call is a new run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh .venv
out="runs/quickstart-$(date +%Y%m%d-%H%M%S)"
.venv/bin/evotrainer run configs/quickstart.yaml --out "$out"
.venv/bin/evotrainer lineage "$out"
echo "run directory: $out (evotrainer status $out)" >&2

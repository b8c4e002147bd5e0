#!/usr/bin/env bash
# The main job: install, then the quickstart (configs/quickstart.yaml): build the base
# (cached), run the evolution loop, and replay its winner beside the reference recipe on
# fresh seeds; prints the table of base, reference and evolved, and writes the run's HTML
# report (RUN/report.html, opens offline). Each call is a new run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh .venv report
out="runs/quickstart-$(date +%Y%m%d-%H%M%S)"
.venv/bin/evotrainer run configs/quickstart.yaml --out "$out"
.venv/bin/evotrainer lineage "$out"
.venv/bin/evotrainer report "$out" >/dev/null
echo "run directory: $out (evotrainer status $out; the report: $out/report.html)" >&2

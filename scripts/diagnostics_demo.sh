#!/usr/bin/env bash
# Health report and backtests on real evidence: the reference recipe from a low-accuracy
# base, then a per-digit partial-credit reward and a length-paying reward backtested on
# its cached rollouts. Usage: scripts/diagnostics_demo.sh [OUT] [TARGET_ACC] (about 2 min).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/diagnostics-demo}
acc=${2:-0.25}
bash scripts/setup-venv.sh .venv
E=.venv/bin/evotrainer
$E pretrain --task arith --target-acc "$acc"
$E train --task arith --target-acc "$acc" --steps 40 --seed 0 --out "$out/reference"
$E diagnose "$out/reference"
for h in partial_credit length_pay; do
  $E backtest --evidence "$out/reference" --harness "examples/harnesses/$h" --out "$out/backtest-$h" 2>/dev/null || true
done
echo "reports: $out/reference/health.md $out/backtest-partial_credit/backtest.md $out/backtest-length_pay/backtest.md"

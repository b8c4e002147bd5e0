"""Backtests: re-score cached rollouts under a candidate harness before training it."""
from evotrainer.backtest.analysis import BacktestConfig, BacktestReport, analyse
from evotrainer.backtest.run import BacktestOutcome, backtest

__all__ = ["BacktestConfig", "BacktestOutcome", "BacktestReport", "analyse", "backtest"]

"""The final comparison, run once at the end of a run: the winner's harness schedule retrained
from the base with the run's `final_seeds`, beside the root harness (the reference recipe)
trained the same total steps with the same seeds (evolve/stats/final.py: why, and its pure parts).
"""
from __future__ import annotations

import json
from typing import Callable

from evotrainer.evolve.search.view import RunView
from evotrainer.evolve.segments.retrain import Arm, RetrainFailed, retrain
from evotrainer.evolve.segments.state import Clock, ControlFailed
from evotrainer.evolve.segments.training import Training
from evotrainer.evolve.stats.final import compare, extend, schedule, table, winner
from evotrainer.lineage.events import Event, FinalFinished, FinalStarted


def winner_schedule(view: RunView, training: Training, max_depth: int) -> tuple[str, list[str], Arm]:
    """The winner ("vN@D"), its harness schedule as versions, and as an arm to retrain: in
    continue mode the harness at each depth along its lineage, continued with its own
    harness to the full budget; in restart mode its one harness for the whole budget."""
    budget = training.cfg.budget
    win = winner(view.trained_states if training.cfg.search.winner == "trained" else view.states)
    if training.restart:
        harnesses, steps = [win.version], budget.total_steps
    else:
        harnesses, steps = extend(schedule(view.trials, win.version, win.depth), max_depth), budget.steps_per_segment
    return f"{win.version}@{win.depth}", harnesses, Arm(tuple(str(training.harness_dir(v)) for v in harnesses), steps)


def run_final(view: RunView, training: Training, max_depth: int, record: Callable[[Event], None],
              sandbox: str) -> FinalFinished:
    """Train and score both arms, write final.json and final.md (`sandbox`: the isolation the
    jobs ran under, in words), and `record` the comparison's start and its result."""
    cfg, run_dir = training.cfg, training.run_dir
    label, harnesses, arm = winner_schedule(view, training, max_depth)
    record(FinalStarted(label, harnesses, list(cfg.final_seeds)))
    if training.on_stage:
        training.on_stage(f"final comparison: {label} and the reference train from the base on seeds "
                          f"{list(cfg.final_seeds)}, then the evaluator scores them")
    arms = {"reference": Arm((str(training.harness_dir("v0")),), cfg.budget.total_steps), "evolved": arm}
    try:
        rep = retrain(training.task, training.base, arms, cfg.final_seeds, run_dir / "final",
                      evaluation=cfg.evaluation, timeout_s=cfg.budget.trial_timeout_s, workers=cfg.workers,
                      runtime=training.runtime, memory_mb=cfg.worker_memory_mb, on_progress=training.on_progress,
                      executor=training.jobs,  # the executor every training and evaluation job runs on
                      cache=training.cache)
    except RetrainFailed as e:
        raise ControlFailed(f"the final comparison: {e}") from None
    comparison = compare(rep.scores["reference"], rep.scores["evolved"])
    result = FinalFinished(label, harnesses, list(cfg.final_seeds), cfg.budget.total_steps, rep.base, comparison,
                           Clock(rep.train_s, rep.eval_s, trained=rep.trained, reused=rep.reused).budgets(), table(rep.base, comparison, cfg.final_seeds))
    (run_dir / "final.json").write_text(json.dumps(result.to_json(), indent=2))
    (run_dir / "final.md").write_text(f"# Final comparison\n\nwinner {result.winner}, schedule "
                                      f"{' -> '.join(harnesses)}\n\n```\n{result.table}\n```\n\nsandbox: {sandbox}\n")
    record(result)
    return result

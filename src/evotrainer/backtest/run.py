"""`backtest`: judge a candidate harness on cached rollouts before spending any training.

Controller side. The candidate is checked for legality (against the harness that
produced the evidence, which is its parent), its reward / filter / advantage run over
the evidence in a worker process, and the statistics and verdict are computed here.
The outcome is labelled: `passed`, `backtest_rejected`, `illegal`, or the worker's
`crash` / `timeout` / `oom`, with the reasons or the captured log tail.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from evotrainer import jobfiles
from evotrainer.backtest.analysis import BacktestConfig, BacktestReport, analyse
from evotrainer.backtest.measured import verdict_note
from evotrainer.backtest.rescore import rescore
from evotrainer.errors import UsageError
from evotrainer.evidence.records import evidence_of
from evotrainer.executors import run_in_worker
from evotrainer.harness.legality import check_harness
from evotrainer.labels import Label


@dataclass
class BacktestOutcome:
    label: str                        # passed | backtest_rejected | illegal | crash | timeout | oom
    reasons: list[str]
    report: BacktestReport | None = None
    log_tail: str = ""
    signal: str = ""                  # fingerprint of the rewards, filter and advantages it gave

    @property
    def passed(self) -> bool:
        return self.label == "passed"

    @property
    def judged(self) -> bool:
        """False where the candidate gives the evidence's own rewards, advantages and groups (an
        optimiser or sampling knob): it passes, but the backtest could not see the change. On
        the landscape tables its passes of such moves predict nothing (docs/benchmarks.md)."""
        return not (self.report is not None and self.report.unchanged)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["report"] = self.report.to_dict() if self.report else None
        return d


def backtest(evidence_dir: Path | str, candidate_dir: Path | str, parent_dir: Path | str | None = None,
             cfg: BacktestConfig = BacktestConfig(), timeout_s: float = 600.0) -> BacktestOutcome:
    ev, cand = Path(evidence_dir), Path(candidate_dir)
    if not jobfiles.exists(ev, "evidence.jsonl"):
        raise UsageError(f"no rollout evidence at '{ev}' (expected evidence.jsonl from `evotrainer train`)")
    if not (cand / "knobs.yaml").is_file():
        raise UsageError(f"not a harness directory: '{cand}' has no knobs.yaml")
    cfg.validate()
    if parent_dir is None and jobfiles.exists(ev, "harness/knobs.yaml"):
        parent_dir = ev / "harness"  # the harness that sampled the evidence
    legality = check_harness(cand, parent_dir)
    if not legality.legal:
        return BacktestOutcome("illegal", legality.reasons)
    res = run_in_worker(rescore, {"evidence_dir": str(ev), "harness_dir": str(cand)}, timeout_s=timeout_s,
                        reads=(str(ev / "evidence.jsonl"), str(ev / "run.json"), str(cand)))  # not ev's checkpoints
    if not res.ok:
        return BacktestOutcome(res.label, [res.error or res.label], log_tail=res.log_tail)
    records = evidence_of(ev / "evidence.jsonl")
    try:  # the worker ran the candidate's code: what it returned is checked before anything reads it
        checked_rescore(res.value, len(records))
    except ValueError as e:
        return BacktestOutcome(Label.BAD_OUTPUT, [f"the rescore returned {e}"], log_tail=res.log_tail)
    report = analyse(records, res.value, cfg)
    return BacktestOutcome("passed" if report.verdict == "pass" else "backtest_rejected", report.reasons, report,
                           signal=signal_fingerprint(res.value))


RESCORED = {"reward": (int, float), "advantage": (int, float), "score": (int, float), "kept": bool, "cut": bool}


def checked_rescore(value: object, n: int) -> None:
    """Raise ValueError unless `value` is what `rescore` returns for `n` records: a list of `n`
    numbers or flags per field, and integer group size and budgets."""
    if not isinstance(value, dict):
        raise ValueError("no object")
    for k, kind in RESCORED.items():
        col = value.get(k)
        if not isinstance(col, list) or len(col) != n or not all(isinstance(x, kind) for x in col):
            raise ValueError(f"no list of {n} values for {k}")
    for k in ("group_size", "max_new_tokens", "evidence_max_new_tokens"):
        if not isinstance(value.get(k), int) or isinstance(value.get(k), bool) or value[k] < 1:
            raise ValueError(f"no positive integer for {k}")


# The knobs a rescore reads: with these and the slot code, the fingerprint covers them.
SIGNAL_KNOBS = ("reward", "group_filter", "advantage", "max_new_tokens")


def rest_key(harness_dir: Path | str) -> str:
    """What a rescore does not see of a harness: every other knob (lr, temperature, loss
    aggregation, ...) and all its code (conservatively: code can touch any slot). Two
    harnesses with equal rest keys and equal signal fingerprints on one evidence give the
    trainer the same signal there (on every rollout a training sampled: they train alike)."""
    h = Path(harness_dir)
    knobs = {k: v for k, v in (yaml.safe_load((h / "knobs.yaml").read_text()) or {}).items() if k not in SIGNAL_KNOBS}
    code = {p.name: p.read_text() for p in sorted(h.glob("*.py"))}
    blob = json.dumps({"knobs": knobs, "code": code}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def same_signal(evidence_dirs, candidate_dir: Path | str, other_dir: Path | str, parent_dir: Path | str,
                timeout_s: float = 600.0) -> bool:
    """Whether two harnesses give the trainer the same signal on every rollout of every
    evidence directory. A directory without its evidence (pruned, or recorded on another
    machine) or a rescore that fails on either side counts as different: what cannot be
    checked is not called alike."""
    def signal(ev, harness) -> str:
        return backtest(ev, harness, parent_dir, timeout_s=timeout_s).signal
    return all(jobfiles.exists(ev, "evidence.jsonl") and (a := signal(ev, candidate_dir)) and
               a == signal(ev, other_dir) for ev in evidence_dirs)


def signal_fingerprint(rescored: dict) -> str:
    """What a candidate's reward, group filter and advantage make of the rollouts, as one hash:
    two harnesses with the same fingerprint give the trainer the same training signal on this
    evidence (drop_dead and score_spread do under a binary reward). Rounded to 1e-6 so float
    noise in equal computations does not split them."""
    blob = json.dumps({"reward": [round(x, 6) for x in rescored["reward"]],
                       "advantage": [round(x, 6) for x in rescored["advantage"]],
                       "kept": rescored["kept"], "cut": rescored["cut"], "max_new_tokens": rescored["max_new_tokens"]})
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def to_markdown(outcome: BacktestOutcome, evidence_dir, candidate_dir) -> str:
    lines = ["# Backtest", "", f"Candidate `{candidate_dir}` on the rollouts of `{evidence_dir}`.", "",
             f"**{outcome.label}**" + (f" ({verdict_note(outcome.label, outcome.judged)})"
                                      if outcome.label in ("passed", "backtest_rejected") else ""), ""]
    lines += [f"- {r}" for r in outcome.reasons]
    rep = outcome.report
    if rep is None:
        if outcome.log_tail:
            lines += ["", "```", outcome.log_tail.rstrip()[-2000:], "```"]
        return "\n".join(lines) + "\n"
    lines += [f"- note: {n}" for n in rep.notes]
    rows = [("rollouts / groups", f"{rep.rollouts} / {rep.groups}"),
            ("ordering violations (before -> after)", f"{rep.ordering_violations_before} -> {rep.ordering_violations}"
             f" of {rep.pairs_compared} pairs"),
            ("  of those, in pairs of differently graded wrong answers", f"{rep.graded_violations} of {rep.graded_pairs} pairs"),
            ("correct rollouts cut by truncation", f"{rep.correct_cut_by_truncation} of {rep.correct_rollouts}"),
            ("correct rollouts in dropped live groups", str(rep.correct_in_dropped_live_groups)),
            ("dead-group ratio (before -> after)", f"{rep.dead_group_ratio_before:.3f} -> {rep.dead_group_ratio_after:.3f}"),
            ("groups kept by the filter", f"{rep.kept_group_ratio:.3f}"),
            ("Spearman(reward, score) (before -> after)",
             f"{_f(rep.reward_score_spearman_before)} -> {_f(rep.reward_score_spearman_after)}"),
            ("advantage share in equal-score groups (before -> after)",
             f"{_f(rep.off_score_signal_before)} -> {_f(rep.off_score_signal_after)}")]
    rows += [(f"  there, correlation with {k}", _f(v)) for k, v in rep.off_score_tracks.items()]
    lines += ["", "| measure | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines) + "\n"


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"

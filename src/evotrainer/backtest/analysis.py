"""Controller side of a backtest: pure statistics over cached rollouts and the candidate's
re-scored rewards and advantages, and the pass/fail verdict with its reasons.

What it asks of a candidate reward, filter or truncation rule, before any training:

- ordering: within a group, does a lower-score rollout ever get more reward than a
  higher-score one? (EvoTrainer: penalty weights 0.01/0.02/0.03 gave 1/7/26 violations)
  A wrong answer out-earning a correct one is what accuracy pays for, so those pairs have
  their own (zero) tolerance; pairs of two wrong answers that a graded verifier tells apart
  are counted and reported, and reject nothing unless a tolerance is set: a shaped reward
  exists to grade wrong answers its own way. reasoning-gym's fallback grades a wrong answer
  by whether it contains the oracle as a substring ("-1 -15" gets 1/3 for "-1", "-4" gets
  0), which per-digit partial credit rightly orders the other way (on chain_sum every one
  of the 8 and 630 violations that rejected partial credit was such a pair); on codegen,
  partial credit re-ordered a third of the pairs that the share of tests passed grades, and
  trained 7.5 validation points above the default recipe.
- cuts: would the truncation rule cut correct rollouts, or the filter drop groups whose
  scores disagree (the only groups binary correctness can learn from)?
- signal: how much advantage falls in groups whose verifier scores are all equal, and what
  does it track there? A reward can keep every correct answer above every wrong one and
  still push the policy around inside all-wrong groups; if that push follows length or
  format rather than closeness to the answer, it is a hack in waiting (a length-paying
  reward drove exact match to 0 within ~20 steps on the tiny policy's 3-digit base).
"""
from __future__ import annotations

import difflib
import math
from dataclasses import asdict, dataclass, field
from typing import Sequence

from evotrainer.diagnostics.evidence_view import mean, pearson, spearman, std
from evotrainer.diagnostics.library import format_failure, repetition
from evotrainer.evidence.records import RolloutRecord
from evotrainer.harness.filters import DEAD_STD

# what the off-score signal may track: closeness to the reference answer is correctness
# at a finer grain; everything else is not correctness
CORRECTNESS_FEATURE = "answer_similarity"
# where no answer is better than another, paying for shorter, finished or well-formed
# completions is the shaping the published recipes use (DAPO's overlong shaping, Kimi k1.5's
# length reward, DeepSeek-R1's format reward); paying the other way is a hack. Feature, and
# what signal against it pushes completions towards.
SHAPING = {"length": "shorter", "truncated": "finished", "format_failure": "well-formed"}


@dataclass(frozen=True)
class BacktestConfig:
    """Tolerances of the verdict.

    max_violation_rate: share of same-group pairs with a correct (full-credit) rollout in
        which the candidate pays the other one more (0: none).
    max_graded_violation_rate: share of same-group pairs of two wrong answers, graded
        differently by the verifier, that the candidate may order the other way (1: any,
        the rule reports and never rejects). Off by default because on the landscape
        tables it vetoed only winners: partial credit on codegen (30-35% of such pairs
        re-ordered, +7.5 validation points when trained) and with dr_grpo (+7.0), and on
        chain_sum before; accuracy does not see the order of two wrong answers.
    max_correct_cut: share of correct rollouts a truncation rule or filter may cut
        (EvoTrainer picked a truncation threshold that still cut a few).
    max_off_score_signal: share of advantage mass in equal-score groups below which it is
        ignored; above it, what the signal tracks decides the verdict. Kept small because
        GRPO normalises each group: a reward that differs by a hair inside an all-wrong
        group gets advantages as large as a correct answer's (the length-paying reward put
        only 7% of its signal there at the start, and still drove accuracy to 0). Signal
        there that pays for shorter, finished or well-formed completions (SHAPING) passes
        with a note: the direction-blind rule rejected DAPO's overlong shaping on every seed
        of three landscape tables, each of which it gained on when trained.
    min_tracking: |correlation| from which a feature counts as what the signal tracks.
    """
    max_violation_rate: float = 0.0
    max_graded_violation_rate: float = 1.0
    max_correct_cut: float = 0.01
    max_off_score_signal: float = 0.02
    min_tracking: float = 0.3

    def validate(self) -> "BacktestConfig":
        for k, v in asdict(self).items():
            if not 0 <= v <= 1:
                raise ValueError(f"backtest {k} must be in [0, 1], got {v}")
        return self


@dataclass
class BacktestReport:
    verdict: str                       # pass | fail
    reasons: list[str]                 # why it failed (empty on pass)
    notes: list[str]                   # what a reader should know either way
    rollouts: int
    groups: int
    pairs_compared: int                # same-group pairs whose scores differ
    ordering_violations: int
    ordering_violations_before: int
    graded_pairs: int                  # of those, pairs of two answers below full credit
    graded_violations: int             # of the violations, those in graded pairs
    correct_rollouts: int
    correct_cut_by_truncation: int
    correct_in_dropped_live_groups: int
    dead_group_ratio_before: float
    dead_group_ratio_after: float
    kept_group_ratio: float
    reward_score_spearman_before: float | None
    reward_score_spearman_after: float | None
    off_score_signal_before: float | None
    off_score_signal_after: float | None
    off_score_tracks: dict[str, float | None] = field(default_factory=dict)
    max_new_tokens: int | None = None
    unchanged: bool = False            # same rewards, advantages and kept groups as the evidence

    def to_dict(self) -> dict:
        return asdict(self)


def answer_similarity(r: RolloutRecord) -> float:
    """How close the text is to the reference answer (difflib's ratio, 1 = identical)."""
    return difflib.SequenceMatcher(None, r.completion.strip(), r.answer).ratio()


FEATURES = {
    "length": lambda r: float(r.length),
    "truncated": lambda r: float(r.truncated),
    "format_failure": lambda r: float(format_failure(r)),
    "repetition": lambda r: repetition(r.completion),
    "policy_confidence": lambda r: r.mean_logprob,
    "turns": lambda r: float(r.turns or 0),  # multi-turn tasks (constant 0, so never tracked, elsewhere)
    CORRECTNESS_FEATURE: answer_similarity,
}


def _groups(n: int, G: int) -> list[range]:
    return [range(i, i + G) for i in range(0, n, G)]


FULL_CREDIT = 1.0  # a verifier's score for a correct answer (Task.score is in [0, 1])


def ordering_violations(rewards: Sequence[float], scores: Sequence[float], G: int,
                        graded: bool | None = None) -> tuple[int, int]:
    """(violations, pairs): same-group pairs with different scores where reward orders them
    the other way. graded=True counts only pairs of two answers below full credit,
    graded=False only pairs with a full-credit one, None all of them."""
    bad = pairs = 0
    for g in _groups(len(rewards), G):
        for i in g:
            for j in g:
                if scores[i] > scores[j] and (graded is None or graded == (scores[i] < FULL_CREDIT)):
                    pairs += 1
                    bad += rewards[i] < rewards[j]
    return bad, pairs


def dead_ratio(rewards: Sequence[float], G: int) -> float:
    groups = _groups(len(rewards), G)
    return sum(std(rewards[i] for i in g) <= DEAD_STD for g in groups) / max(len(groups), 1)


def off_score_signal(adv: Sequence[float], kept: Sequence[bool], scores: Sequence[float], G: int) -> float | None:
    """Share of |advantage| mass (kept groups) in groups whose verifier scores are all equal."""
    total = off = 0.0
    for g in _groups(len(adv), G):
        mass = sum(abs(adv[i]) for i in g if kept[i] and math.isfinite(adv[i]))
        total += mass
        if len({scores[i] for i in g}) == 1:
            off += mass
    return off / total if total > 0 else None


# Groups a track's correlation reads at most, evenly spread over the steps: 1024 groups of 8 put
# the standard error of a correlation near 0.01, and the full 4.8k groups of a 75-step segment
# cost ~1.4 s of difflib per backtest on the controller's critical path.
MAX_TRACK_GROUPS = 1024


def off_score_tracks(records: Sequence[RolloutRecord], adv: Sequence[float], kept: Sequence[bool],
                     scores: Sequence[float], G: int) -> dict[str, float | None]:
    """Correlation of the advantage with each feature inside equal-score groups (within-group
    centred), over at most MAX_TRACK_GROUPS of them."""
    idx = [list(g) for g in _groups(len(adv), G)
           if len({scores[i] for i in g}) == 1 and all(kept[i] for i in g) and std(adv[i] for i in g) > 1e-9]
    if len(idx) > MAX_TRACK_GROUPS:
        idx = [idx[round(k * (len(idx) - 1) / (MAX_TRACK_GROUPS - 1))] for k in range(MAX_TRACK_GROUPS)]
    out = {}
    for name, feat in FEATURES.items():
        if any(feat(records[i]) is None for g in idx for i in g):
            out[name] = None  # not recorded (another trainer's export without log-probs)
            continue
        a, f = [], []
        for g in idx:
            vals = [feat(records[i]) for i in g]
            ma, mf = mean(adv[i] for i in g), mean(vals)
            a += [adv[i] - ma for i in g]
            f += [v - mf for v in vals]
        r = pearson(a, f)
        out[name] = None if r is None else round(r, 4)
    return out


def analyse(records: Sequence[RolloutRecord], new: dict, cfg: BacktestConfig = BacktestConfig()) -> BacktestReport:
    """The backtest report for records re-scored by `rescore` (same order, one entry per record)."""
    G = new["group_size"]
    old_r, old_s = [r.reward for r in records], [r.score for r in records]
    old_adv, old_kept = [r.advantage for r in records], [r.kept for r in records]
    rew, adv, kept, scores = new["reward"], new["advantage"], new["kept"], new["score"]
    groups = _groups(len(records), G)

    # one pass per kind of pair; the totals are their sums
    correct_bad, correct_pairs = ordering_violations(rew, scores, G, graded=False)
    graded_bad, graded_pairs = ordering_violations(rew, scores, G, graded=True)
    bad, pairs = correct_bad + graded_bad, correct_pairs + graded_pairs
    bad_before, _ = ordering_violations(old_r, old_s, G)
    # correct: full credit. A graded verifier's partial credit is not an answer a cut would lose
    # (reasoning-gym credits a long completion that merely contains the oracle)
    correct = [i for i, s in enumerate(old_s) if s >= FULL_CREDIT]
    cut = sum(new["cut"][i] for i in correct)
    dropped_live = sum(1 for g in groups if not kept[g[0]] and len({scores[i] for i in g}) > 1
                       for i in g if scores[i] >= FULL_CREDIT)
    tracks = off_score_tracks(records, adv, kept, scores, G)
    rep = BacktestReport(
        verdict="pass", reasons=[], notes=[], rollouts=len(records), groups=len(groups),
        pairs_compared=pairs, ordering_violations=bad, ordering_violations_before=bad_before,
        graded_pairs=graded_pairs, graded_violations=graded_bad,
        correct_rollouts=len(correct), correct_cut_by_truncation=cut, correct_in_dropped_live_groups=dropped_live,
        dead_group_ratio_before=round(dead_ratio(old_r, G), 4), dead_group_ratio_after=round(dead_ratio(rew, G), 4),
        kept_group_ratio=round(sum(kept[g[0]] for g in groups) / max(len(groups), 1), 4),
        reward_score_spearman_before=_round(spearman(old_r, old_s)), reward_score_spearman_after=_round(spearman(rew, scores)),
        off_score_signal_before=_round(off_score_signal(old_adv, old_kept, old_s, G)),
        off_score_signal_after=_round(off_score_signal(adv, kept, scores, G)),
        off_score_tracks=tracks, max_new_tokens=new.get("max_new_tokens"),
        unchanged=(rew == old_r and kept == old_kept and scores == old_s
                   and all(abs(a - b) <= 1e-6 for a, b in zip(adv, old_adv))))
    rep.reasons, rep.notes = verdict(rep, cfg)
    rep.verdict = "fail" if rep.reasons else "pass"
    return rep


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _rate(bad: int, pairs: int) -> float:
    return bad / pairs if pairs else 0.0


def verdict(rep: BacktestReport, cfg: BacktestConfig) -> tuple[list[str], list[str]]:
    """(reasons to reject, notes): pure function of the report's numbers."""
    reasons, notes = [], []
    bad, pairs = rep.ordering_violations - rep.graded_violations, rep.pairs_compared - rep.graded_pairs
    msg = (f"{bad} ordering violations in {pairs} same-group pairs with a correct rollout "
           f"(a wrong answer gets more reward than a correct one)")
    (reasons if _rate(bad, pairs) > cfg.max_violation_rate else notes).append(msg)
    if rep.graded_pairs:
        msg = (f"{rep.graded_violations} of {rep.graded_pairs} pairs of wrong answers that the verifier grades "
               f"differently are ordered the other way" + (f" (tolerance {cfg.max_graded_violation_rate:.0%})"
                                                          if cfg.max_graded_violation_rate < 1 else ""))
        (reasons if _rate(rep.graded_violations, rep.graded_pairs) > cfg.max_graded_violation_rate
         else notes).append(msg)

    n_correct = max(rep.correct_rollouts, 1)
    if rep.correct_cut_by_truncation / n_correct > cfg.max_correct_cut:
        reasons.append(f"max_new_tokens={rep.max_new_tokens} would cut {rep.correct_cut_by_truncation} of "
                       f"{rep.correct_rollouts} correct rollouts")
    elif rep.correct_cut_by_truncation:
        notes.append(f"max_new_tokens={rep.max_new_tokens} cuts {rep.correct_cut_by_truncation} of "
                     f"{rep.correct_rollouts} correct rollouts (within tolerance)")
    if rep.correct_in_dropped_live_groups / n_correct > cfg.max_correct_cut:
        reasons.append(f"the group filter drops groups whose verifier scores disagree, losing the signal of "
                       f"{rep.correct_in_dropped_live_groups} correct rollouts")
    if rep.unchanged:
        notes.append("the candidate gives the same rewards, advantages and groups as the evidence: "
                     "a backtest cannot see its change (an optimiser or sampling knob); only training can judge it")
    notes.append(f"dead groups {rep.dead_group_ratio_before:.1%} -> {rep.dead_group_ratio_after:.1%}; "
                 f"groups kept by the filter {rep.kept_group_ratio:.1%}")

    off = rep.off_score_signal_after or 0.0
    known = {k: v for k, v in rep.off_score_tracks.items() if v is not None}
    top = max(known, key=lambda k: abs(known[k])) if known else None
    share = f"{off:.0%} of the advantage signal falls in groups whose verifier scores are all equal"
    if off > cfg.max_off_score_signal:
        if top == CORRECTNESS_FEATURE and abs(known[top]) >= cfg.min_tracking:
            notes.append(f"{share}; there it tracks closeness to the reference answer "
                         f"(r = {known[top]:+.2f}), a finer grain of correctness")
        elif top in SHAPING and known[top] <= -cfg.min_tracking:
            notes.append(f"{share}; there it tracks {top} (r = {known[top]:+.2f}): shaping towards "
                         f"{SHAPING[top]} completions where no answer is better than another")
        elif top is not None and abs(known[top]) >= cfg.min_tracking:
            sim = known.get(CORRECTNESS_FEATURE)
            reasons.append(f"{share}, and there it tracks {top} (r = {known[top]:+.2f}), not correctness "
                           f"(closeness to the answer r = {sim if sim is None else f'{sim:+.2f}'}): "
                           f"the policy would be pushed towards {top} where no answer is better than another")
        else:
            reasons.append(f"{share}, and there it tracks none of the measured features "
                           f"({', '.join(FEATURES)}): noise, not correctness")
    elif off > 0:
        notes.append(share)
    return reasons, notes

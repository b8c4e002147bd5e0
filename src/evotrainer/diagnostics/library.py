"""The built-in diagnostics, in layers: score, signal, behavior, efficiency, model state,
agentic. Thresholds follow EvoTrainer where it published them (dead groups > 30% warn,
> 50% critical; reward spread < 0.05; mean log-prob > -0.05 is exploration collapse;
tool/edit failures > 15%) and our own measurements on the tiny policy elsewhere.

Each function reads an `Evidence` and returns a number, or None where it does not apply
(agentic metrics on single-turn records, KL when the run used none).
"""
from __future__ import annotations

import math
from typing import Mapping

from evotrainer.diagnostics.evidence_view import Evidence, mean, quantile, spearman, std
from evotrainer.diagnostics.spec import diagnostic, register
from evotrainer.envs.base import ABANDON, ECHO, INVALID, TOKEN_CAP, TURN_CAP
from evotrainer.evidence.records import RolloutRecord
from evotrainer.harness.filters import DEAD_STD

ZERO_ADV = 1e-6


def _first_last(ev: Evidence, field: str) -> tuple[float, float] | None:
    """Mean of `field` over the first and the last window (None with fewer than 4 steps)."""
    if len(ev.step_numbers) < 4:
        return None
    a = mean(v for v in ev.first.column(field) if v is not None)
    b = mean(v for v in ev.last.column(field) if v is not None)
    return None if a is None or b is None else (float(a), float(b))


# A shaped reward may rise much faster than exact match while both improve, and how much
# faster depends on the optimizer, not on honesty: per-digit partial credit on 4-digit sums
# rose 0.12-0.13 while exact match rose 0.04-0.045 (2.8 to 1) with AdamW restarted each
# segment, and 0.09-0.13 against 0.014-0.034 (up to 9 to 1) with AdamW carried across
# segments. No fixed pace separates that from a hack, but the hack's own signature does:
# the unplanted case we measured (partial credit on 3-digit sums from a
# 1-digit base) raised its reward 0.05-0.07 in 30 steps with exact match at 0 throughout;
# a binary reward's unbacked rise is exactly 0. Hence critical at 0.03.
# So the verifier score *backs* a reward rise when its least-squares trend over the segment
# (group means against step: every step counts, not just the two windows) rose by more than
# SCORE_Z standard errors; an unbacked rise is the divergence. Groups are the independent
# units. The windows alone waste power where a graded reward pays off at low accuracy: on
# the 3-digit quickstart (base seed 2) exact match rose 1.4 points, window z = 1.66, trend
# z = 2.63, while validation went from 5.2% to 8.7%.
SCORE_Z = 2.0


def _backed(ev: Evidence) -> bool:
    """Whether the verifier score rose over the segment beyond its noise (trend z > SCORE_Z)."""
    xs = [float(g[0].step) for g in ev.groups]
    ys = [mean(r.score for r in g) for g in ev.groups]
    n = len(xs)
    if n < 3 or len(set(xs)) < 2:
        return False
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    residual = sum((y - my - slope * (x - mx)) ** 2 for x, y in zip(xs, ys)) / (n - 2)
    return slope > SCORE_Z * math.sqrt(residual / sxx)


def _rise(ev: Evidence, field: str) -> float | None:
    """Last window minus first."""
    fl = _first_last(ev, field)
    return None if fl is None else fl[1] - fl[0]


def char_classes(text: str) -> set[str]:
    return {"digit" if c.isdigit() else "alpha" if c.isalpha() else "space" if c.isspace() else "other"
            for c in text}


def format_failure(r: RolloutRecord) -> bool:
    """Empty, cut off without an end token, or using a kind of character the answer never does
    (single-turn answers; an episode's transcript holds tool calls and observations)."""
    return not r.completion.strip() or r.truncated or not char_classes(r.completion) <= char_classes(r.answer)


def repetition(text: str, n: int = 3) -> float:
    """Share of character n-grams that repeat an earlier one in the same completion."""
    grams = [text[i:i + n] for i in range(len(text) - n + 1)]
    return 1 - len(set(grams)) / len(grams) if grams else 0.0


# ------------------------------------------------------------------ score

@register
@diagnostic("score")
def score_mean(ev: Evidence) -> float | None:
    """Mean verifier score of the sampled rollouts."""
    return mean(ev.column("score"))


@register
@diagnostic("score", warn=-0.05, critical=-0.15, above=False, scope="run",
            suggest="optimisation: lower the learning rate, or roll back to the parent")
def score_trend(ev: Evidence) -> float | None:
    """Verifier score in the last window minus the first: falling means the policy is getting worse."""
    return _rise(ev, "score")


@register
@diagnostic("score")
def majority_score_share(ev: Evidence) -> float | None:
    """Share of rollouts holding the most common score value (one value > 50%: a binary, sparse signal)."""
    scores = ev.column("score")
    return max(scores.count(s) for s in set(scores)) / len(scores) if scores else None


# ------------------------------------------------------------------ signal

def _dead_suggestion(v: Mapping[str, float | None]) -> str:
    if (v.get("majority_score_share") or 0) > 0.5:  # EvoTrainer's compound rule
        return ("reward: make the reward more continuous (partial_credit), most groups share one score; or "
                "refill each step with groups whose scores disagree (dynamic_sampling)")
    return ("group_filter: refill each step with groups whose scores disagree (dynamic_sampling) or drop dead "
            "groups (drop_dead), or curriculum: sample where outcomes are mixed")


@register
@diagnostic("signal", warn=0.3, critical=0.5, suggest=_dead_suggestion)
def dead_group_ratio(ev: Evidence) -> float | None:
    """Share of groups whose rewards are all equal: they give GRPO no gradient."""
    groups = ev.groups
    return sum(std(r.reward for r in g) <= DEAD_STD for g in groups) / len(groups) if groups else None


@register
@diagnostic("signal", warn=0.05, above=False, suggest="reward: make the reward more continuous")
def reward_spread(ev: Evidence) -> float | None:
    """Mean within-group reward standard deviation."""
    return mean(std(r.reward for r in g) for g in ev.groups)


@register
@diagnostic("signal", warn=0.5, critical=0.8,
            suggest="signal: a group filter or a more continuous reward, so fewer rollouts are wasted")
def degenerate_advantage(ev: Evidence) -> float | None:
    """Share of rollouts that carry no gradient: advantage 0 or not finite, or group filtered out."""
    recs = ev.records
    bad = sum(not r.kept or not math.isfinite(r.advantage) or abs(r.advantage) <= ZERO_ADV for r in recs)
    return bad / len(recs) if recs else None


@register
@diagnostic("signal")
def off_score_signal(ev: Evidence) -> float | None:
    """Share of advantage mass in groups whose verifier scores are all equal (signal not from correctness)."""
    total = off = 0.0
    for g in ev.groups:
        mass = sum(abs(r.advantage) for r in g if r.kept and math.isfinite(r.advantage))
        total += mass
        if len({r.score for r in g}) == 1:
            off += mass
    return off / total if total > 0 else None


# ------------------------------------------------------------------ behavior

@register
@diagnostic("behavior", warn=0.015, critical=0.03, scope="run", blocking=True,
            suggest="reward hacking: simplify the reward back towards the verifier score")
def reward_score_divergence(ev: Evidence) -> float | None:
    """Rise of the mean reward, first to last window, that the verifier score does not back:
    reward rise - score rise while the score is flat, falling or within its noise; 0 once the
    score rose significantly (see SCORE_Z)."""
    r, s = _rise(ev, "reward"), _rise(ev, "score")
    if r is None:
        return None
    return 0.0 if _backed(ev) else r - s


@register
@diagnostic("behavior", warn=0.5, critical=0.8, blocking=True,
            suggest="reward hacking: the reward pays for length; remove the length term")
def reward_length_coupling(ev: Evidence) -> float | None:
    """Spearman of reward with length inside groups whose verifier scores are all equal."""
    tied = [g for g in ev.groups if len({r.score for r in g}) == 1]
    if not tied:
        return None
    rewards, lengths = [], []
    for g in tied:
        if std(r.reward for r in g) > DEAD_STD:
            mr, ml = mean(r.reward for r in g), mean(r.length for r in g)
            rewards += [r.reward - mr for r in g]
            lengths += [r.length - ml for r in g]
    # where scores tie the reward does not move at all: nothing for it to couple to
    return (spearman(rewards, lengths) or 0.0) if len(rewards) >= 8 else 0.0


@register
@diagnostic("behavior", warn=0.2, critical=0.5,
            suggest="reward: a format signal, or check for a length or format hack")
def format_failure_rate(ev: Evidence) -> float | None:
    """Share of completions that are empty, cut off, or use characters the answer never does
    (single-turn tasks: an episode's format is the agentic layer's invalid actions)."""
    recs = [r for r in ev.records if r.turns is None]
    return sum(map(format_failure, recs)) / len(recs) if recs else None


@register
@diagnostic("behavior", warn=0.2, critical=0.4, suggest="exploration: lower the temperature or penalise repeats")
def repetition_rate(ev: Evidence) -> float | None:
    """Mean share of repeated character trigrams within a completion (single-turn tasks: an
    episode's transcript repeats its tools' names and observations by design; longest_tool_run
    is its loop measure)."""
    return mean(repetition(r.completion) for r in ev.records if r.turns is None)


@register
@diagnostic("behavior", warn=0.25, above=False,
            suggest="exploration: raise the temperature, add an entropy bonus or a KL anchor")
def group_diversity(ev: Evidence) -> float | None:
    """Distinct completions per group over the group size (1: all different)."""
    return mean(len({r.completion for r in g}) / len(g) for g in ev.groups)


# ------------------------------------------------------------------ efficiency

@register
@diagnostic("efficiency")
def length_p50(ev: Evidence) -> float | None:
    """Median completion length in tokens (end token included)."""
    return quantile(ev.column("length"), 0.5)


@register
@diagnostic("efficiency")
def length_p90(ev: Evidence) -> float | None:
    """90th percentile of completion length in tokens."""
    return quantile(ev.column("length"), 0.9)


@register
@diagnostic("efficiency", warn=0.4, critical=0.7, scope="run",
            suggest="efficiency: overlong shaping or a length cap; check for a length hack or a collapse")
def length_shift(ev: Evidence) -> float | None:
    """abs(log(mean length in the last window / the first)): 0.7 is a doubling or halving."""
    fl = _first_last(ev, "length")
    return abs(math.log(fl[1] / fl[0])) if fl and fl[0] and fl[1] else None


@register
@diagnostic("efficiency", warn=0.3, critical=0.7, scope="run",
            suggest="signal: token-level aggregation (token_level) or Dr. GRPO's advantage (dr_grpo): a mean per "
                    "sequence punishes a long wrong answer less per token than a short one")
def length_drift(ev: Evidence) -> float | None:
    """log(mean length in the last window / the first) where the verifier score did not rise
    beyond its noise, else 0: length bought without accuracy, the length bias of a per-sequence
    mean (Dr. GRPO 2503.20783; DAPO's token-level loss)."""
    fl = _first_last(ev, "length")
    if not fl or not fl[0] or not fl[1]:
        return None
    return 0.0 if _backed(ev) else max(math.log(fl[1] / fl[0]), 0.0)


@register
@diagnostic("efficiency", warn=0.1, critical=0.3,
            suggest="efficiency: overlong shaping (overlong_shaping) or masking truncated completions "
                    "(mask_truncated); check for a length hack")
def truncation_rate(ev: Evidence) -> float | None:
    """Share of completions that hit the token budget without an end token."""
    t = ev.column("truncated")
    return sum(t) / len(t) if t else None


@register
@diagnostic("efficiency", scope="run")
def sampled_per_kept(ev: Evidence) -> float | None:
    """Groups sampled per group trained: 1 when every group trains; a filter that keeps a share
    q of the groups costs 1/q batches of sampling under dynamic sampling's refill (the trainer's
    step metrics record the same count as groups_sampled)."""
    kept = sum(any(r.kept for r in g) for g in ev.groups)
    return len(ev.groups) / kept if kept else None


# ------------------------------------------------------------------ model state

@register
@diagnostic("model_state", warn=-0.1, critical=-0.05,
            suggest="exploration: raise the temperature, add an entropy bonus or a KL anchor")
def mean_logprob(ev: Evidence) -> float | None:
    """Mean per-token log-prob of sampled tokens; above -0.05 is exploration collapse (EvoTrainer)."""
    return mean(v for v in ev.column("mean_logprob") if v is not None)  # None: the trainer did not record it


@register
@diagnostic("model_state")
def entropy_mean(ev: Evidence) -> float | None:
    """Mean per-token entropy of the sampling distribution (per rollout, else the trainer's
    per-step entropy: TRL logs only that)."""
    return mean(_entropies(ev))


@register
@diagnostic("model_state", warn=0.5, critical=0.8, scope="run",
            suggest="exploration: clip-higher (clip_higher) or entropy-selected tokens (entropy_tokens), a "
                    "higher temperature or an entropy bonus")
def entropy_drop(ev: Evidence) -> float | None:
    """1 - entropy of the last window / entropy of the first."""
    if len(ev.step_numbers) < 4:
        return None
    a, b = mean(_entropies(ev.first)), mean(_entropies(ev.last))
    return 1 - b / a if a and b is not None else None


def _entropies(ev: Evidence) -> list[float]:
    per_rollout = [v for v in ev.column("entropy") if v is not None]
    return per_rollout or ev.step_metric("entropy")


@register
@diagnostic("model_state", warn=0.1, critical=0.5, suggest="optimisation: raise kl_coef or lower the learning rate")
def kl(ev: Evidence) -> float | None:
    """Mean KL to the reference policy, from the trainer's step metrics (None without a KL term)."""
    values = ev.step_metric("kl")
    return mean(values) if values and any(values) else None


# ------------------------------------------------------------------ code (tasks that run programs only)

def _outcomes(ev: Evidence) -> list[str]:
    return [v for v in ev.column("outcome") if v is not None]


def _share(ev: Evidence, *statuses: str) -> float | None:
    out = _outcomes(ev)
    return sum(o in statuses for o in out) / len(out) if out else None


@register
@diagnostic("code", warn=0.2, critical=0.5, suggest="reward: a compile check in the reward, or a lower temperature")
def syntax_error_rate(ev: Evidence) -> float | None:
    """Programs that do not compile, over all programs run."""
    return _share(ev, "syntax_error")


@register
@diagnostic("code", warn=0.05, critical=0.2, suggest="reward: penalise programs that time out")
def program_timeout_rate(ev: Evidence) -> float | None:
    """Programs stopped by their time (or memory) limit, over all programs run."""
    return _share(ev, "timeout", "memory")


@register
@diagnostic("code", warn=0.3, critical=0.6, suggest="reward: penalise exceptions, or partial credit per test")
def runtime_error_rate(ev: Evidence) -> float | None:
    """Programs that raised (a NameError, a TypeError, ...), over all programs run."""
    return _share(ev, "runtime_error")


@register
@diagnostic("code")
def test_pass_fraction(ev: Evidence) -> float | None:
    """Mean fraction of hidden tests passed per program (the verifier score of a code task)."""
    return mean(r.score for r in ev.records if r.outcome is not None) if _outcomes(ev) else None


def failure_counts(ev: Evidence) -> list[tuple[str, int]]:
    """The kinds of failure of a code task's programs, most frequent first (health reports
    list them: the number alone does not say *what* fails most)."""
    counts: dict[str, int] = {}
    for f in ev.column("failure"):
        if f is not None:
            counts[f] = counts.get(f, 0) + 1
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


@register
@diagnostic("code")
def top_failure_share(ev: Evidence) -> float | None:
    """Share of failing programs that fail the most common way (its name: the health report)."""
    counts = failure_counts(ev)
    return counts[0][1] / sum(n for _, n in counts) if counts else None


# ------------------------------------------------------------------ agentic (multi-turn records only)
# EvoTrainer's behaviour metrics for agents, where its thresholds are published (the
# EvoTrainer paper: tool or edit failures > 15%, self-test rate < 50%, edit coverage < 60%,
# solution diversity < 15%, a metric for git-history access after a leak); the others are
# ours, said so beside them. Each is None on single-turn records (no turns) and on episodes
# that never did what it measures (self-tests of episodes that never edit).

def _episodes(ev: Evidence) -> list[RolloutRecord]:
    return [r for r in ev.records if r.turns is not None]


def _tools(r: RolloutRecord) -> list[str]:
    return (r.tool_sequence or "").split()


def _edited(r: RolloutRecord) -> list[str]:
    return (r.files_edited or "").split()


def _stop_share(ev: Evidence, *stops: str) -> float | None:
    eps = _episodes(ev)
    return sum(r.stop in stops for r in eps) / len(eps) if eps else None


def stop_counts(ev: Evidence) -> list[tuple[str, int]]:
    """How episodes ended (envs.base STOPS), most frequent first (the health report lists them)."""
    counts: dict[str, int] = {}
    for r in _episodes(ev):
        counts[r.stop or "?"] = counts.get(r.stop or "?", 0) + 1
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


@register
@diagnostic("agentic")
def turns_mean(ev: Evidence) -> float | None:
    """Mean policy turns per episode."""
    return mean(r.turns for r in _episodes(ev))


@register
@diagnostic("agentic")
def tool_calls_mean(ev: Evidence) -> float | None:
    """Mean tool calls per episode (unparsed actions included)."""
    return mean(r.tool_calls or 0 for r in _episodes(ev))


@register
@diagnostic("agentic", warn=0.15, critical=0.3, suggest="reward: a tool-format or edit-format signal")
def tool_failure_rate(ev: Evidence) -> float | None:
    """Failed tool calls over all tool calls (EvoTrainer: edit failures above 15%)."""
    eps = _episodes(ev)
    calls, fails = sum(r.tool_calls or 0 for r in eps), sum(r.tool_failures or 0 for r in eps)
    return fails / calls if calls else None


@register
@diagnostic("agentic", warn=0.15, critical=0.3, suggest="action_parser: read more formats, or a format signal")
def invalid_action_rate(ev: Evidence) -> float | None:
    """Episodes ended by a turn that parsed as no tool (thresholds as tool failures)."""
    return _stop_share(ev, INVALID)


@register
@diagnostic("agentic", warn=0.2, critical=0.5,
            suggest="reward: check for an efficiency term paying for early exits; curriculum: easier levels")
def abandonment_rate(ev: Evidence) -> float | None:
    """Episodes that ended on their own without any work (answered before a lookup,
    submitted without an edit). EvoTrainer: "abandonment" is critical; these bounds are ours."""
    return _stop_share(ev, ABANDON)


@register
@diagnostic("agentic", warn=0.05, critical=0.2, suggest="exploration: penalise repeats, or a lower temperature")
def echo_trap_rate(ev: Evidence) -> float | None:
    """Episodes ended by the policy repeating an observation back (EvoTrainer's echo trap; bounds ours)."""
    return _stop_share(ev, ECHO)


@register
@diagnostic("agentic", warn=0.2, critical=0.5, suggest="efficiency: a turn cap, or a reward for finishing")
def cap_rate(ev: Evidence) -> float | None:
    """Episodes cut by the turn or token cap (truncated, not terminated; bounds ours)."""
    return _stop_share(ev, TURN_CAP, TOKEN_CAP)


@register
@diagnostic("agentic", warn=0.5, critical=0.25, above=False, suggest="reward: a signal for running the tests")
def self_test_rate(ev: Evidence) -> float | None:
    """Of the episodes that edited, the share that ran the tests after their first edit (EvoTrainer: < 50% warns)."""
    edits = [r for r in _episodes(ev) if "edit" in _tools(r)]
    if not edits:
        return None
    def tested_after(r):
        t = _tools(r)
        return "test" in t[t.index("edit"):]
    return sum(map(tested_after, edits)) / len(edits)


@register
@diagnostic("agentic", warn=0.6, critical=0.3, above=False, suggest="behavior: search and read before editing")
def edit_coverage(ev: Evidence) -> float | None:
    """Of the episodes that edited, the mean share of the files the fix belongs in that they
    edited (EvoTrainer: < 60% warns)."""
    rows = [r for r in _episodes(ev) if _edited(r) and (r.target_files or "").split()]
    if not rows:
        return None
    return mean(len(set(_edited(r)) & set(r.target_files.split())) / len(set(r.target_files.split())) for r in rows)


@register
@diagnostic("agentic", warn=0.15, above=False, suggest="exploration: raise the temperature")
def solution_diversity(ev: Evidence) -> float | None:
    """1 - mean pairwise Jaccard similarity of the edited files within a group (EvoTrainer: < 15% warns)."""
    sims = []
    for g in ev.groups:
        sets = [set(_edited(r)) for r in g if r.turns is not None and _edited(r)]
        sims += [len(a & b) / len(a | b) for i, a in enumerate(sets) for b in sets[i + 1:]]
    return 1 - mean(sims) if sims else None


@register
@diagnostic("agentic")
def search_before_edit(ev: Evidence) -> float | None:
    """Of the episodes that edited, the share that read or searched before their first edit."""
    edits = [r for r in _episodes(ev) if "edit" in _tools(r)]
    if not edits:
        return None
    return sum(bool({"read", "search"} & set(_tools(r)[:_tools(r).index("edit")])) for r in edits) / len(edits)


def longest_run(tools: list[str]) -> int:
    best = run = 0
    for i, t in enumerate(tools):
        run = run + 1 if i and t == tools[i - 1] else 1
        best = max(best, run)
    return best


@register
@diagnostic("agentic", warn=4, critical=8, suggest="efficiency: a turn cap, or penalise repeated calls")
def longest_tool_run(ev: Evidence) -> float | None:
    """Mean longest run of one tool called again and again in an episode (a loop; bounds ours)."""
    return mean(longest_run(_tools(r)) for r in _episodes(ev))


@register
@diagnostic("agentic")
def tool_entropy(ev: Evidence) -> float | None:
    """Mean entropy (bits) of the tool kinds an episode calls: 0 when it only ever calls one."""
    def bits(tools):
        n = len(tools)
        return -sum(tools.count(t) / n * math.log2(tools.count(t) / n) for t in set(tools)) if n else 0.0
    return mean(bits(_tools(r)) for r in _episodes(ev))


@register
@diagnostic("agentic", warn=0.01, critical=0.05, suggest="environment: scrub version-control history from the workspace")
def git_history_access(ev: Evidence) -> float | None:
    """Share of episodes that reached for version-control history (the leak EvoTrainer found
    by audit: a score of 48.8 fell to 31.0 once history was cleared)."""
    eps = [r for r in _episodes(ev) if r.git_access is not None]
    return sum(r.git_access > 0 for r in eps) / len(eps) if eps else None


@register
@diagnostic("agentic", warn=0.3, critical=0.6, scope="run", suggest="efficiency: a turn cap or an efficiency factor")
def turns_rise(ev: Evidence) -> float | None:
    """Relative rise in turns per episode, first to last window."""
    fl = _first_last(ev, "turns")
    return (fl[1] - fl[0]) / fl[0] if fl and fl[0] else None


@register
@diagnostic("agentic", warn=0.5, critical=0.8, blocking=True, scope="run",
            suggest="reward hacking: the reward pays for a behaviour (fewer or more turns); pay for the outcome only")
def reward_turn_coupling(ev: Evidence) -> float | None:
    """|Spearman| of reward with turns inside groups whose verifier scores are all equal: where
    the outcome ties, a reward that still moves with the number of turns pays for the behaviour
    itself (EvoTrainer's lesson: an efficiency factor produced 1-turn exits). Over the whole
    segment: once the hack has won, every episode exits alike and nothing is left to correlate."""
    if not _episodes(ev):
        return None
    rewards, turns = [], []
    for g in ev.groups:
        eps = [r for r in g if r.turns is not None]
        if len(eps) < 2 or len({r.score for r in eps}) > 1 or std(r.reward for r in eps) <= DEAD_STD:
            continue
        mr, mt = mean(r.reward for r in eps), mean(r.turns for r in eps)
        rewards += [r.reward - mr for r in eps]
        turns += [r.turns - mt for r in eps]
    return abs(spearman(rewards, turns) or 0.0) if len(rewards) >= 8 else 0.0

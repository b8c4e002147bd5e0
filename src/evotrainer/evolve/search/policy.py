"""The search controller's own policy, and the rules controller that revises it from what the
lineage shows worked (`search.controller: evolving`; `fixed` keeps the starting policy).

What the search decides with (evolve/search/parents.py) is one record, ControllerPolicy: the weights
of the intervention families the agent tries first, how often a crossover is due, how
greedily a parent is picked (the selection temperature), how many elites are kept (the
frontier), how many failures in a row roll the search back and make it subtract, and
whether near misses are merged. An
evolving run revises it every `revise_every` trials, by rules:

    family weights   a bandit over intervention families, on what its judged trials gained: the
                     validation gain over the control of each trial that trained and scored
                     (kept or discarded), -1 point for one refused without a usable score
                     (backtest, legality, a blocking finding); their sum over n + 1 (one prior
                     trial at no gain: a single lucky trial counts half) gives the weight
                     2 ** (mean / 2 points), within [0.25, 2] (untried: 1): no family dies. A
                     gain, not the kept rate: where nothing clears the gate every family would
                     weigh alike, and a near miss (+2 points) is what the next trial should follow.
                     A family's trials count from its last kept one on: the keep spent what it
                     gained before (the parent now holds that change, and further moves of the
                     same surface start from there), so a kept family returns to 1 until its
                     later trials say otherwise. On arith3-weak one reward move gained +24, and
                     weighed by it the reward family was tried four more times from the new
                     parent, losing 1 to 27 points each
    coverage         from the first revision's turn on (whether or not it moved a value), a
                     family this run has not tried yet weighs COVER (as if it had gained +1
                     point) at the next proposal, until its first
                     trial (`weights_now`): UCB's bonus for an arm never pulled, one trial per
                     family. Without it the rules agent reaches the optimisation family last,
                     and no rules search on arith3-weak tried the step size the hand sweep
                     found best there (and on vault3, chain_sum and codegen)
    crossover rate   the kept rate of crossovers over that of mutations (each the mean of a
                     Beta(1 + kept, 1 + not kept) posterior) scales the minimum crossover rate
                     from 0.25, within [0.1, 0.5] (once two crossovers ran)
    frontier,        nothing kept in `revise_every` or more trials since the last revision:
    temperature,     one more elite (at most 8), a hotter selection (+0.005, at most 0.05), and
    merging          near misses merged from then on (evolve/search/near_miss.py: two discarded
                     changes whose mean gains reached the gate's minimum, tried together, for
                     where single moves are too small for the gate to see); a branch that keeps
                     improving (two kept trials since, one descending from the other): one
                     fewer (at least 2) and cooler (-0.005, at least 0)
    revert after     once subtractions ran twice: revert after 2 failures where they were
                     kept at least as often as other changes, after 4 where none was, else 3

The bandit's rules read the whole run and set a value from a posterior, so the same evidence
never moves a value twice; the streak rules read only the trials since the last revision, so
a streak is counted once. A temperature is in units of the parent score (accuracy gains):
at 0.005, a parent scoring half a point lower is picked e times less often.

`revise` is pure. The controller records what it decides as a ControllerRevised event (the
new policy, what changed, the reason, the trials cited) before relying on it, so a resume
reads the same policy back; RUN/controller/policy-rN.yaml keeps each revision (r0: the
starting policy) and policy.yaml the current one, rewritten from the lineage.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Mapping, Sequence

import yaml

from evotrainer.agents.rules import FAMILY_ORDER
from evotrainer.config import SearchConfig
from evotrainer.evolve.search import history
from evotrainer.labels import AGENT_FAILED, CRASHED, Label
from evotrainer.lineage.events import ControllerRevised
from evotrainer.lineage.plan import TrialPlan

FAMILIES = (*FAMILY_ORDER, "subtract")   # what the family weights weigh
WEIGHT = (0.25, 2.0)                     # a revised family weight stays within these
FRONTIER = (2, 8)
TEMPERATURE = (0.0, 0.05)
TEMPERATURE_STEP = 0.005
BASE_RATE = 0.25                         # the crossover rate where both operators keep alike
CROSSOVER_RATE = (0.1, 0.5)              # never two crossovers in a row: above a half is moot
GAIN_SCALE = 0.02                        # a family's shrunk mean gain of this doubles its weight (minus: halves)
REFUSED = -0.01                          # what a judged trial refused without a usable score counts as gaining
COVER = 1.41                             # an untried family's weight from the first revision's turn: 2 ** (1 point / 2)
COVERED = ("reward", "group_filter", "signal", "curriculum", "exploration", "optimisation", "efficiency")
# (the surfaces coverage visits; reward_hacking's and subtract's moves answer a finding or an escalation)


@dataclass(frozen=True)
class ControllerPolicy:
    family_weights: Mapping[str, float] = field(default_factory=lambda: dict.fromkeys(FAMILIES, 1.0))
    crossover_window: int = 4            # crossover_due: one is due when none ran in this many operations
    crossover_min_rate: float = BASE_RATE  # ... or when fewer than this share of them were crossovers
    temperature: float = 0.0             # parent selection: 0 takes the best score, > 0 draws by softmax
    frontier: int = 4                    # elites kept (the population's capacity)
    revert_after: int = 3                # failures in a row that roll back and escalate
    revise_every: int = 3                # trials between revisions (an evolving controller)
    merge_near_misses: bool = False      # merge two discarded near misses into one trial (evolve/search/near_miss.py)

    @classmethod
    def initial(cls, search: SearchConfig) -> "ControllerPolicy":
        """The run's starting policy: today's fixed settings, the config's frontier."""
        return cls(frontier=search.population, revise_every=search.revise_every)

    def to_json(self) -> dict:
        return {f.name: dict(getattr(self, f.name)) if f.name == "family_weights" else getattr(self, f.name)
                for f in fields(self)}

    @classmethod
    def from_json(cls, data: Mapping) -> "ControllerPolicy":
        """A stored policy; a key this code does not know is passed over, one it lacks takes the default."""
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in data.items() if k in known}
        if "family_weights" in kw:
            kw["family_weights"] = dict.fromkeys(FAMILIES, 1.0) | dict(kw["family_weights"])
        return cls(**kw)


@dataclass(frozen=True)
class Revision:
    policy: ControllerPolicy
    changes: tuple[str, ...]             # what moved, one entry per value
    reason: str                          # why, in words, one clause per rule that fired
    cites: tuple[int, ...]               # the trials the reason rests on


def changes(old: ControllerPolicy, new: ControllerPolicy) -> list[str]:
    """'frontier 4 -> 5', 'weight reward 1 -> 1.5': each value that differs."""
    out = []
    for f in fields(ControllerPolicy):
        a, b = getattr(old, f.name), getattr(new, f.name)
        if f.name == "family_weights":
            out += [f"weight {k} {a.get(k, 1.0):g} -> {b.get(k, 1.0):g}" for k in dict.fromkeys([*a, *b])
                    if a.get(k, 1.0) != b.get(k, 1.0)]
        elif isinstance(a, bool) and a != b:
            out.append(f"{f.name.replace('_', ' ')} {'on' if a else 'off'} -> {'on' if b else 'off'}")
        elif a != b:
            out.append(f"{f.name.replace('_', ' ')} {a:g} -> {b:g}")
    return out


# ---------------------------------------------------------------------------- revising

def due(policy: ControllerPolicy, trials: Sequence, since: int) -> bool:
    """`revise_every` trials (budgeted ones: not `equivalent`) finished after trial `since`."""
    return sum(1 for t in trials if t.parents and t.id > since and t.label != Label.EQUIVALENT) >= policy.revise_every


def revise(policy: ControllerPolicy, trials: Sequence, plans: Mapping[int, TrialPlan], since: int = 0) -> Revision | None:
    """The next policy where one is due and the evidence moves a value, else None. `since`:
    the last trial the previous revision read (0: none yet); `plans`: trial -> its plan (the
    family an llm's free-text change recorded)."""
    if not due(policy, trials, since):
        return None
    trials = sorted(trials, key=lambda t: t.id)
    families = {n: p.family for n, p in plans.items()}
    # judged on its merits: the agent produced a change and training finished (or a check refused it)
    judged = [t for t in trials if t.parents and t.label not in CRASHED | AGENT_FAILED | {Label.EQUIVALENT, Label.ABORTED}]
    new, why, cites = policy, [], set()
    for rule in (_family_bandit, _operator_bandit, _reverting):
        out = rule(new, judged, families)
        if out:
            new, clause, cited = out
            why.append(clause)
            cites |= cited
    out = _streaks(new, trials, since)
    if out:
        new, clause, cited = out
        why.append(clause)
        cites |= cited
    moved = changes(policy, new)
    return Revision(new, tuple(moved), "; ".join(why), tuple(sorted(cites))) if moved else None


def _kept(ts: Sequence) -> int:
    return sum(1 for t in ts if t.label == Label.KEPT)


def _posterior(ts: Sequence) -> float:
    """The mean of Beta(1 + kept, 1 + not kept): the kept rate, shrunk towards a half."""
    return (_kept(ts) + 1) / (len(ts) + 2)


def _clamp(x, bounds):
    return min(max(x, bounds[0]), bounds[1])


def _ids(ts: Sequence) -> str:
    return ", ".join(str(t.id) for t in ts)


def _gain(t) -> float:
    """What a judged trial says of its family: its gain over the control where it trained and
    was scored on its merits (kept, discarded), else REFUSED (an invalid trial's score was gamed)."""
    gain = t.fitness.gain if t.label in (Label.KEPT, Label.DISCARDED) else None
    return REFUSED if gain is None else gain


def _family_bandit(policy: ControllerPolicy, judged: Sequence, families: Mapping[int, str | None]):
    by: dict[str, list] = {}
    for t in judged:
        by.setdefault(history.family(t.intervention, families.get(t.id)), []).append(t)
    weights, said, cited = dict(policy.family_weights), [], set()
    for fam in FAMILIES:
        ts = by.get(fam, [])
        if not ts:  # no evidence: the weight stays where it is
            continue
        kept = [t for t in ts if t.label == Label.KEPT]
        if kept:  # the last keep spent what the family gained up to it
            ts = [t for t in ts if t.id > kept[-1].id]
        if not ts:
            if weights.get(fam, 1.0) != 1.0:
                weights[fam] = 1.0
                said.append(f"{fam}'s gains were spent by its keep (trial {kept[-1].id}): from 1 again")
                cited.add(kept[-1].id)
            continue
        mean = sum(_gain(t) for t in ts) / (len(ts) + 1)  # shrunk towards no gain by one prior trial
        w = _clamp(round(2 ** (mean / GAIN_SCALE), 2), WEIGHT)
        if w != weights.get(fam, 1.0):
            weights[fam] = w
            since = f" since its keep (trial {kept[-1].id})" if kept else ""
            said.append(f"{fam} gained {100 * mean:+.1f} points a trial{since} (summed over n + 1), "
                        f"kept {_kept(ts)} of {len(ts)} (trials {_ids(ts)})")
            cited |= {t.id for t in ts}
    if not said:
        return None
    return replace(policy, family_weights=weights), "families weighed by what they gained: " + "; ".join(said), cited


def _operator_bandit(policy: ControllerPolicy, judged: Sequence, families):
    cross = [t for t in judged if t.intervention == history.CROSSOVER]
    mutations = [t for t in judged if t.intervention != history.CROSSOVER]
    if len(cross) < 2 or not mutations:
        return None
    rate = _clamp(round(BASE_RATE * _posterior(cross) / _posterior(mutations), 2), CROSSOVER_RATE)
    if rate == policy.crossover_min_rate:
        return None
    return (replace(policy, crossover_min_rate=rate),
            f"crossovers kept {_kept(cross)} of {len(cross)} (trials {_ids(cross)}), mutations {_kept(mutations)} "
            f"of {len(mutations)}: cross over {'more' if rate > policy.crossover_min_rate else 'less'}",
            {t.id for t in cross})


def _reverting(policy: ControllerPolicy, judged: Sequence, families):
    subtract = [t for t in judged if history.family(t.intervention, families.get(t.id)) == "subtract"]
    others = [t for t in judged if t not in subtract and t.intervention != history.CROSSOVER]
    if len(subtract) < 2:
        return None
    if _kept(subtract) and _posterior(subtract) >= _posterior(others):
        after, how = 2, "kept at least as often as other changes: revert sooner"
    elif not _kept(subtract):
        after, how = 4, "never kept: revert later"
    else:
        after, how = 3, "kept less often than other changes"
    if after == policy.revert_after:
        return None
    return (replace(policy, revert_after=after),
            f"subtractions kept {_kept(subtract)} of {len(subtract)} (trials {_ids(subtract)}), {how}",
            {t.id for t in subtract})


def _streaks(policy: ControllerPolicy, trials: Sequence, since: int):
    """Stalled since the last revision: explore wider; a branch improving: exploit it."""
    recent = [t for t in trials if t.parents and t.id > since and t.label != Label.EQUIVALENT]
    kept = [t for t in recent if t.label == Label.KEPT]
    if len(recent) >= policy.revise_every and not kept:
        frontier = policy.frontier + 1 if policy.frontier < FRONTIER[1] else policy.frontier
        temperature = round(_clamp(policy.temperature + TEMPERATURE_STEP, TEMPERATURE), 6)
        new = replace(policy, frontier=frontier, temperature=temperature, merge_near_misses=True)
        merging = "" if policy.merge_near_misses else ", and near misses merged"
        return (new, f"nothing kept in trials {_ids(recent)}: a wider frontier and a hotter selection{merging}",
                {t.id for t in recent}) if new != policy else None
    line = [(a, b) for a in kept for b in kept
            if a.id < b.id and b.version and a.version in history.ancestors(trials, b.version)]
    if not line:
        return None
    frontier = policy.frontier - 1 if policy.frontier > FRONTIER[0] else policy.frontier
    temperature = round(_clamp(policy.temperature - TEMPERATURE_STEP, TEMPERATURE), 6)
    new = replace(policy, frontier=frontier, temperature=temperature)
    branch = sorted({t.id for pair in line for t in pair})
    return (new, f"a branch keeps improving (kept trials {', '.join(map(str, branch))}, one descending from "
                 "another): a narrower frontier and a greedier selection", set(branch)) if new != policy else None


# ---------------------------------------------------------------------------- the run's policy

def current(revised: Sequence[ControllerRevised], initial: ControllerPolicy) -> ControllerPolicy:
    """The policy in force: the latest revision's, else the starting one."""
    return ControllerPolicy.from_json(revised[-1].policy) if revised else initial


def weights_now(policy: ControllerPolicy, trials: Sequence, plans: Mapping[int, TrialPlan]) -> dict[str, float]:
    """The family weights the next proposal uses: the policy's, and from the first revision's
    turn on (`revise_every` budgeted trials finished, whether or not the revision moved a
    value), each surface (COVERED) that no trial of this run has tried yet at COVER where it
    weighs less. `plans`: every started trial's (in flight included: a family another trial is
    trying is tried); a trial that ended `equivalent` trained nothing, so it tried nothing.
    Before that turn the findings and the fixed order lead, as for a fixed controller."""
    weights = dict(policy.family_weights)
    if not due(policy, trials, 0):
        return weights
    tried = tried_families(trials, plans)
    for fam in COVERED:
        if fam not in tried and weights.get(fam, 1.0) < COVER:
            weights[fam] = COVER
    return weights


def tried_families(trials: Sequence, plans: Mapping[int, TrialPlan]) -> dict[str, int]:
    """Trials per family this run has started (`plans`: in flight included); a trial that ended
    `equivalent` trained nothing, so it tried nothing."""
    untrained = {t.id for t in trials if t.label == Label.EQUIVALENT}
    out: dict[str, int] = {}
    for n, p in plans.items():
        if n not in untrained:
            fam = history.family(p.intervention, p.family)
            out[fam] = out.get(fam, 0) + 1
    return out


def decide(policy: ControllerPolicy, trials: Sequence, plans: Mapping[int, TrialPlan],
           revised: Sequence[ControllerRevised]) -> ControllerRevised | None:
    """The revision to record now, as its event, where one is due and moves a value."""
    since = revised[-1].after if revised else 0
    rev = revise(policy, trials, plans, since)
    if rev is None:
        return None
    return ControllerRevised(len(revised) + 1, max(t.id for t in trials), rev.policy.to_json(), list(rev.changes),
                             rev.reason, list(rev.cites))


def write_files(directory: Path, initial: ControllerPolicy, revised: Sequence[ControllerRevised]) -> None:
    """policy-r0.yaml (the starting policy), policy-rN.yaml per revision and policy.yaml (the
    current one), each headed by why it is what it is. Rewritten whole from the lineage, so a
    kill between recording a revision and writing its file leaves nothing stale after a resume."""
    directory.mkdir(parents=True, exist_ok=True)
    texts = [("# revision 0: the run's starting policy\n", initial.to_json())]
    texts += [(f"# revision {r.revision} after trial {r.after}: {'; '.join(r.changes)}\n# because {r.reason}\n"
               f"# cites trials {', '.join(map(str, r.cites))}\n", r.policy) for r in revised]
    for i, (head, policy) in enumerate(texts):
        _write(directory / f"policy-r{i}.yaml", head + yaml.safe_dump(policy, sort_keys=False))
    _write(directory / "policy.yaml", (directory / f"policy-r{len(texts) - 1}.yaml").read_text())


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # a reader never sees half a policy

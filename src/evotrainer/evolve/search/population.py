"""The population: a few elite states, how a parent is chosen among them, and who gets in.

A single greedy path plateaus: GEAR (arXiv 2605.13874) keeps several research states
instead, scores each as a parent by what its children achieved plus an exploration bonus,
novelty and coverage, minus a penalty for recent reuse, and admits newcomers by rules that
keep both the best and a diverse near-tie. Everything here is a pure function of plain
records (the controller builds them from the lineage), so each rule is unit-tested on
hand-made populations.

    score(e) = mean child gain
             + c * sqrt(ln(N + 2) / (n + 1))          exploration (N trials so far, n children of e)
             - recency, if e was a parent in the last `recent` trials
             + novelty_w * novelty(e)                 Jaccard distance of its changes to recent parents'
             + coverage_w / sqrt(density + 1)         density: other elites on e's harness surface
             + fitness_w * (fitness - best fitness)   ours: GEAR's elites are all strong; ours fill
                                                      up with weak early states, whose children's
                                                      gains must not outweigh being far behind
             - exhausted, if e is spent               its version was exhausted at another depth (the
                                                      agent had nothing left for that harness), or its
                                                      last `exhaust_after` children all failed

The parent is the argmax of the score (temperature 0), or drawn from a softmax of the scores
at a temperature with a seeded generator (the evolving controller's policy: exploring when
the search stalls), so a resumed run draws the same parent again.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from typing import Collection, Iterable, Mapping, Sequence


@dataclass(frozen=True)
class Elite:
    version: str
    depth: int
    fitness: float                    # mean validation accuracy over the run's seeds
    changes: frozenset[str] = frozenset()   # interventions along its lineage: what it is
    surface: str = "root"             # the harness surface (intervention family) of its last change
    role: str = ""                    # best | lean | diverse | member (set by `roles`)

    @property
    def key(self) -> tuple[str, int]:
        return (self.version, self.depth)


@dataclass(frozen=True)
class Child:
    """A finished trial as selection sees it: which states it came from and its gain."""
    trial: int
    parents: tuple[tuple[str, int], ...]   # (version, depth) of the first parent, then the second
    gain: float | None                     # validation gain over the control (None: never trained)
    crossover: bool = False
    failed: bool = False                   # it gave no state to build on (labels.FAILED)


@dataclass(frozen=True)
class SelectionConfig:
    """Weights of the parent score (GEAR's defaults, scaled to accuracy gains of a few points)."""
    exploration: float = 0.02     # c: bonus for states with few children
    recency: float = 0.01         # penalty for a state used as parent in the last `recent` trials
    recent: int = 2
    novelty: float = 0.01         # weight of the Jaccard distance to recent parents' changes
    coverage: float = 0.01        # weight of 1/sqrt(density + 1) of its surface
    fitness: float = 1.0          # weight of the gap to the best elite's fitness (<= 0)
    capacity: int = 4             # elites kept
    replace_margin: float = 0.01  # a newcomer replaces the best only when it beats it by this much
    near_tie: float = 0.01        # within this of the weakest, a more novel newcomer replaces it
    exhausted: float = 0.02       # penalty for a spent parent: about a failed child's lost gain
    exhaust_after: int = 3        # children failed in a row that make a parent spent
    lean_share: float = 0.8       # "most of the gain": the share of the best's gain over the reference


def jaccard_distance(a: frozenset, b: frozenset) -> float:
    union = a | b
    return 1.0 - len(a & b) / len(union) if union else 0.0


def usage(children: Iterable[Child]) -> dict[tuple[str, int], tuple[float, float, int]]:
    """(expansions, summed gain, last trial used) per parent state. A child's gain credits its
    first parent fully and a crossover's second parent by half, as in GEAR."""
    out: dict[tuple[str, int], tuple[float, float, int]] = {}
    for c in children:
        for i, p in enumerate(c.parents):
            w = 1.0 if i == 0 else 0.5
            n, g, last = out.get(p, (0.0, 0.0, -1))
            out[p] = (n + w, g + w * (c.gain or 0.0), max(last, c.trial))
    return out


def failing(children: Iterable[Child]) -> dict[tuple[str, int], int]:
    """Per parent state: how many of its latest children (as first parent) failed in a row."""
    out: dict[tuple[str, int], int] = {}
    for c in sorted(children, key=lambda c: c.trial):
        first = c.parents[0]
        out[first] = out.get(first, 0) + 1 if c.failed else 0
    return out


def parent_scores(elites: Sequence[Elite], children: Sequence[Child], trial: int,
                  *, cfg: SelectionConfig = SelectionConfig(), recent_parents: Sequence[frozenset] = (),
                  exhausted: Collection[str] = ()) -> dict:
    """The parent score of each elite (by key) before trial `trial`; `exhausted`: versions the
    agent had nothing left for at some depth (ParentExhausted), a penalty at every other depth."""
    used, streaks = usage(children), failing(children)
    total = len(children)
    top = max((e.fitness for e in elites), default=0.0)
    scores = {}
    for e in elites:
        n, gain_sum, last = used.get(e.key, (0.0, 0.0, -1))
        mean_gain = gain_sum / n if n else 0.0
        explore = cfg.exploration * math.sqrt(math.log(total + 2) / (n + 1))
        recency = cfg.recency if last >= 0 and trial - last <= cfg.recent else 0.0
        novelty = (sum(jaccard_distance(e.changes, r) for r in recent_parents) / len(recent_parents)
                   if recent_parents else 1.0)
        density = sum(1 for o in elites if o.surface == e.surface and o.key != e.key)
        spent = e.version in exhausted or streaks.get(e.key, 0) >= cfg.exhaust_after
        scores[e.key] = (mean_gain + explore - recency + cfg.novelty * novelty
                         + cfg.coverage / math.sqrt(density + 1) + cfg.fitness * (e.fitness - top)
                         - (cfg.exhausted if spent else 0.0))
    return scores


def select_parent(elites: Sequence[Elite], children: Sequence[Child], trial: int,
                  *, cfg: SelectionConfig = SelectionConfig(), recent_parents: Sequence[frozenset] = (),
                  exhausted: Collection[str] = (), temperature: float = 0.0, seed: int | str = 0) -> Elite | None:
    """The elite with the highest parent score (fitness, then depth, then name break ties); at a
    temperature > 0, one drawn with probability proportional to exp(score / temperature), by a
    generator seeded with `seed` (the same seed, the same draw: a resume repeats the choice)."""
    if not elites:
        return None
    s = parent_scores(elites, children, trial, cfg=cfg, recent_parents=recent_parents, exhausted=exhausted)
    ranked = sorted(elites, key=lambda e: (round(s[e.key], 12), e.fitness, e.depth, e.version), reverse=True)
    if temperature <= 0:
        return ranked[0]
    top = s[ranked[0].key]  # shifted by the best score: exp never overflows
    weights = [math.exp((s[e.key] - top) / temperature) for e in ranked]
    return random.Random(seed).choices(ranked, weights)[0]


def promote(pop: Sequence[Elite], new: Elite, cfg: SelectionConfig = SelectionConfig(),
            reference: float | None = None) -> tuple[list[Elite], str]:
    """The population after `new` asks to join, and what happened:

    fill            there is room;
    replace_best    it beats the best by more than `replace_margin` (it takes the best's place);
    replace_weakest it beats the weakest;
    diverse         a near-tie of the weakest (within `near_tie`) that is further from the others;
    rejected        none of these.

    `reference`: the reference harness's fitness, what the roles measure gains from.
    """
    pop = [e for e in pop if e.key != new.key]
    if len(pop) < cfg.capacity:
        return roles(pop + [new], cfg, reference), "fill"
    best = max(pop, key=lambda e: e.fitness)
    weakest = min(pop, key=lambda e: (e.fitness, e.depth))
    if new.fitness > best.fitness + cfg.replace_margin:
        return roles([new if e is best else e for e in pop], cfg, reference), "replace_best"
    if new.fitness > weakest.fitness:
        return roles([new if e is weakest else e for e in pop], cfg, reference), "replace_weakest"
    others = [e for e in pop if e is not weakest]
    if weakest.fitness - new.fitness <= cfg.near_tie and _spread(new, others) > _spread(weakest, others):
        return roles([new if e is weakest else e for e in pop], cfg, reference), "diverse"
    return list(pop), "rejected"


def roles(pop: Sequence[Elite], cfg: SelectionConfig = SelectionConfig(),
          reference: float | None = None) -> list[Elite]:
    """best: the fittest; lean (GEAR): the smallest diff from the reference (fewest changes)
    that keeps most of the gain, fewer changes than the best and at least `lean_share` of the
    best's gain over `reference` (or within `near_tie` of the best; with no reference, that
    alone); diverse: the furthest from the rest; the others: member."""
    if not pop:
        return []
    best = max(pop, key=lambda e: (e.fitness, e.depth))

    def keeps_most(e: Elite) -> bool:
        near = best.fitness - e.fitness <= cfg.near_tie
        gain = best.fitness - reference if reference is not None else 0.0
        return near or gain > 0 and e.fitness - reference >= cfg.lean_share * gain
    near = [e for e in pop if e is not best and len(e.changes) < len(best.changes) and keeps_most(e)]
    lean = min(near, key=lambda e: (len(e.changes), -e.fitness), default=None)
    rest = [e for e in pop if e is not best and e is not lean]
    diverse = max(rest, key=lambda e: _spread(e, [o for o in pop if o is not e]), default=None)
    role = {id(best): "best"} | ({id(lean): "lean"} if lean else {}) | ({id(diverse): "diverse"} if diverse else {})
    return [replace(e, role=role.get(id(e), "member")) for e in pop]


def _spread(e: Elite, others: Sequence[Elite]) -> float:
    """Mean Jaccard distance of e's changes to the others'."""
    return sum(jaccard_distance(e.changes, o.changes) for o in others) / len(others) if others else 0.0


# ---------------------------------------------------------------------------------- crossover

@dataclass(frozen=True)
class Merge:
    files: dict[str, str] = field(default_factory=dict)   # the merged harness's changed files
    knobs: dict = field(default_factory=dict)             # knob -> value, from either side
    conflicts: tuple[str, ...] = ()                       # what both sides changed differently


def merge(base_knobs: dict, a_knobs: dict, b_knobs: dict, *, base_files: dict[str, str],
          a_files: dict[str, str], b_files: dict[str, str]) -> Merge:
    """A three-way merge of two versions' harness diffs against their common ancestor: a knob
    or a slot file changed on one side only is taken; changed on both sides to different
    values it is a conflict (named, never guessed)."""
    knobs, knob_conflicts = _three_way(base_knobs, a_knobs, b_knobs, "knob")
    files, file_conflicts = _three_way(base_files, a_files, b_files, "file")
    return Merge(files, knobs, tuple(knob_conflicts + file_conflicts))


def _three_way(base: dict, a: dict, b: dict, kind: str) -> tuple[dict, list[str]]:
    """Entries changed on one side only are taken; changed on both, differently, conflict."""
    out, conflicts = {}, []
    for key in sorted(set(base) | set(a) | set(b)):
        o, x, y = base.get(key), a.get(key), b.get(key)
        if x != o and y != o and x != y:
            conflicts.append(f"knob {key}: {x!r} vs {y!r}" if kind == "knob" else f"file {key}")
        elif x != o or y != o:
            out[key] = x if x != o else y
    return out, conflicts


def crossover_due(ops: Sequence[str], window: int = 4, min_rate: float = 0.25) -> bool:
    """Whether the next operation should be a crossover, from the kinds of the operations so
    far ("mutation" / "crossover", crashes left out): never twice in a row (a mutation
    follows a crossover), otherwise when none happened in the last `window` or the rate is
    under `min_rate`. Too early to tell (fewer than `window` operations): no."""
    if len(ops) < window or ops[-1] == "crossover":
        return False
    return "crossover" not in ops[-window:] or ops.count("crossover") / len(ops) < min_rate


def mates(pop: Sequence[Elite], first: Elite, crossed: Mapping[frozenset[str], int] | None = None) -> list[Elite]:
    """Elites whose changes `first` lacks (a crossover would add something), most different
    first; a pair already crossed (`crossed`: pair of versions -> crossovers, either order)
    after every fresh one, the least crossed first: retrying a pair is the last resort."""
    crossed = crossed or {}
    out = [e for e in pop if e.key != first.key and e.changes - first.changes]
    return sorted(out, key=lambda e: (crossed.get(frozenset((first.version, e.version)), 0),
                                      -jaccard_distance(e.changes, first.changes), -e.fitness, e.version))

"""The rules agent: offline and deterministic. Findings in, one intervention out.

It reads the parent's health-report findings worst first, maps each to the intervention
family its suggestion names ("reward: ...", "group_filter: ..."), and lists every move
that applies and was not tried from this parent yet, from the catalog's named entries and
the search space around them (agents/space.py): for each family the findings name, the
catalog's moves then the space's, the moves the finding names first ("(mask_truncated)"); then the catalog's moves of every other family in a
fixed order, and last the space's (without a finding to point at a family, the named,
literature-backed changes are the better first tries). An evolving search controller
weighs the families by what they gained in this run (evolve/search/policy.py): then the
heavier families come first, and findings lead only among families of equal weight. The
space is finite per parent, so the agent always has a next idea until both are spent
(None). The skill library then reorders that list by what the same findings led to before
(`skills.rank`), and an escalation (three failures in a row) switches layer and prefers
subtracting, then the learning rate's family (on arith3-weak's landscape table the searches
reached `lower_lr`, its best single move, at trial 4 instead of after the findings' other
families: +1.5 test points at 8 trials; the other three tables unchanged).
"""
from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Mapping, Sequence

from evotrainer.agents.edits import harness_files
from evotrainer.agents.interface import AgentContext, Proposal
from evotrainer.agents.interventions import FAMILY, INTERVENTIONS, revert
from evotrainer.agents.space import Parent, reach, space
from evotrainer.skills import Conditions, rank, signature

FAMILY_ORDER = ("reward_hacking", "reward", "group_filter", "signal", "curriculum", "exploration",
                "optimisation", "efficiency")
ESCALATED_FIRST = "optimisation"


def family_of(suggestion: str) -> str | None:
    """'reward hacking: simplify ...' -> 'reward_hacking'; 'group_filter: drop ...' -> 'group_filter'."""
    head = suggestion.split(":", 1)[0].strip().replace(" ", "_")
    return head if head in FAMILY_ORDER else None


def family_order(named: Sequence[str], weights: Mapping[str, float],
                 trials: Mapping[str, int] | None = None) -> list[tuple[str, str]]:
    """(family, "catalog" | "space") in the order the agent tries their moves: the heavier
    families first (an evolving controller's weights); among equal weights (all of them, with
    none), each family a finding names, its catalog moves then the space's, then the other
    families' catalog moves in FAMILY_ORDER, then their space moves. With `trials` (trials
    per family in this run: search.order spread), the least tried families of a weight lead,
    in that order among themselves: a finding's family is tried once, then every other
    family once, before any is tried again (the tables found the best single move outside
    the family the root's findings name on most tasks: Dr. GRPO on codegen, a lower
    learning rate on arith)."""
    out = []
    for w in sorted({weights.get(f, 1.0) for f in FAMILY_ORDER}, reverse=True):
        tier = [f for f in FAMILY_ORDER if weights.get(f, 1.0) == w]
        for n in sorted({trials.get(f, 0) for f in tier}) if trials is not None else [None]:
            group = [f for f in tier if n is None or trials.get(f, 0) == n]
            lead = [f for f in named if f in group]
            rest = [f for f in group if f not in lead]
            out += [(f, kind) for f in lead for kind in ("catalog", "space")]
            out += [(f, "catalog") for f in rest] + [(f, "space") for f in rest]
    return out


def draw(cands: Sequence[Proposal], weights: Mapping[str, float], seed: int) -> Proposal:
    """One candidate at random, each as likely as its family's weight (no weights: uniformly,
    the draw the random agent always made)."""
    rng = random.Random(seed)
    if not weights:
        return rng.choice(cands)
    return rng.choices(cands, [weights.get(p.family, 1.0) for p in cands])[0]


def candidates(ctx: AgentContext) -> list[Proposal]:
    """Every applicable, untried intervention in rule order, each naming the finding it answers."""
    esc = ctx.escalation
    findings = [f for f in ctx.findings if not esc or f.get("diagnostic") not in esc.ignore]
    named = list(dict.fromkeys(f for f in (family_of(x.get("suggest", "")) for x in findings) if f))
    moves_of = {"catalog": catalog_moves(ctx), "space": space_moves(ctx)}
    out = []
    for family, kind in family_order(named, ctx.family_weights, ctx.family_trials):
        moves = moves_of[kind]
        why = next((x for x in findings if family_of(x.get("suggest", "")) == family), None)
        for p in sorted(moves, key=lambda p: named_at(why, p)):  # what the finding names first, in its order
            if p.family != family or p.intervention in ctx.tried:
                continue
            if why is not None:  # the finding this answers is the evidence of the hypothesis
                p = replace(p, hypothesis=f"{p.hypothesis} (evidence: {why['evidence']})", trigger=signature(why))
            elif (w := ctx.family_weights.get(family, 1.0)) > 1.0:  # else the controller's reason to try it
                p = replace(p, hypothesis=f"{p.hypothesis} (the search controller weighs {family} {w:g})")
            out.append(p)
    if esc:
        # the findings led to three failures in a row: the learning rate's family, the first knob
        # a careful engineer's sweep tunes, leads its equals (an evolving controller's heavier still lead)
        out = sorted(out, key=lambda p: (-ctx.family_weights.get(p.family, 1.0), p.family != ESCALATED_FIRST))
        if esc.subtract:  # subtracting first: each change of the parent from the root, undone
            out = [p for p in revert(ctx.knobs, ctx.root_knobs) if p.intervention not in ctx.tried] + out
        # a family the controller's weights favour (it gained where it was tried) is not left
        # for having failed the gate: a near miss is what the next trial should follow
        avoid = esc.avoid - {f for f, w in ctx.family_weights.items() if w > 1.0}
        out = [p for p in out if p.family not in avoid] or out
    return [p for p in out if not reach(p.family, p.knobs, p.files, ctx.knobs) & ctx.closed]


def named_at(finding: Mapping | None, p: Proposal) -> float:
    """Where a finding's suggestion names the move ("... (mask_truncated)"); infinity where not."""
    at = finding.get("suggest", "").find(f"({p.intervention})") if finding is not None else -1
    return math.inf if at < 0 else at


def catalog_moves(ctx: AgentContext) -> list[Proposal]:
    """Every catalog entry that applies to the parent, tried or not, in the catalog's order."""
    return [p for name in FAMILY if (p := INTERVENTIONS.get(name)(ctx.knobs, ctx.target_level)) is not None]


def space_moves(ctx: AgentContext) -> list[Proposal]:
    """The search space's moves for the parent, less any that makes a change a catalog entry
    (tried or not) or an earlier move already makes: one change is one trial, under the
    catalog's name where it has one (the space's `entropy_coef_on` is the catalog's
    `entropy_bonus`)."""
    files = harness_files(ctx.harness_dir) if ctx.harness_dir is not None else {}
    seen, out = {_change(p) for p in catalog_moves(ctx)}, []
    for p in space(Parent(ctx.knobs, ctx.target_level, files, ctx.seed)):
        if _change(p) not in seen:
            seen.add(_change(p))
            out.append(p)
    return out


def _change(p: Proposal) -> tuple:
    """What a proposal does to the harness, comparable: its knob values and file contents."""
    return (tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in p.knobs.items())),
            tuple(sorted(p.files.items())))


def propose(ctx: AgentContext) -> Proposal | None:
    """The first candidate after the skill library has reordered them."""
    cands = candidates(ctx)
    if not cands:
        return None
    by_name = {p.intervention: p for p in cands}
    order = rank(list(by_name), ctx.findings, ctx.skills,
                 Conditions(ctx.task, ctx.target_level, ctx.reference_acc, ctx.backend))
    if ctx.escalation and ctx.escalation.subtract:  # subtractions stay first when escalated
        order = [n for n in by_name if n.startswith("revert_")] + [n for n in order if not n.startswith("revert_")]
    return by_name[order[0]]


def propose_random(ctx: AgentContext) -> Proposal | None:
    """The random single-variable baseline: any applicable untried intervention of the catalog
    and the search space, uniformly (so most draws are the space's: it is the larger)."""
    cands = candidates(replace(ctx, findings=(), skills=(), escalation=None))
    if not cands:
        return None
    return replace(draw(cands, ctx.family_weights, ctx.seed), agent="random")

"""The search space beside the catalog: parametric, structural and composed-reward moves.

The catalog (agents/interventions.py) holds named, literature-backed changes. This module adds
the room around them, as pure functions of the parent (its knobs, target level, slot
files and a seed) that each return `Proposal`s changing one variable:

- parametric: every tunable continuous or integer knob has a declared `Range`. A knob
  that is on moves by population-based training's x0.8 and x1.25, clamped to its range,
  and by one resample from the range; a coefficient at 0 (the term is off) perturbs to
  nothing, so it gets one "on" move at the range's low end (the gentlest setting) instead.
  The group size halves coupled with prompts per step (rollouts per step stay equal), the
  other direction being the catalog's `larger_groups`.
- structural: each slot knob to every implementation its registry offers other than the
  current one, the parent's own slot file included (read as an AST, never imported). A
  move that makes the same change as a catalog entry is left out by the rules agent
  (rules.space_moves), so a change is tried once, under the catalog's name.
- composed rewards: a weighted sum of typed parts (verifier score, partial credit, length,
  format), rendered from a `RewardSpec` into a function appended to the parent's
  `reward.py`, with `reward:` set to it. The one variable is the reward. A parent whose
  reward is such a sum also gets each non-score weight perturbed x0.8 / x1.25.

Knobs not in the space, and why:
    steps, prompts_per_step, num_iterations: the run's compute budget (legality.BUDGET_KNOBS).
    max_new_tokens: may only fall, and 0 means the task's own budget, which this module does
        not know; the catalog's `truncate` sets it.
    top_k: what k means depends on the vocabulary (50 is every token of a character model,
        few of a 150k-token one), which this module does not know.
    adam_beta1, adam_beta2: values near 1 move on a (1 - beta) scale; x0.8 of 0.99 is nonsense.
    train_levels: a list of levels, not a number; the catalog's `easier_mix` changes it.
    clip_delta, mask_truncated, top_entropy_quantile, tis_cap, refill_rounds: switches of the
        recipe components, each the catalog's named move (two_sided_clip, mask_truncated,
        entropy_tokens, tis, dynamic_sampling) at the value its paper uses.
    action_parser: must match the task's turn format (a JSON parser on the character model
        reads no action at all); it is a task fit, not a training choice to search.
A knob or slot whose value cannot change training under the parent's other knobs gets no
move (`MATTERS`): with one update per sampled batch every ratio is 1, so no clip bound is
reached and a clip move would train a noise replica of its parent at a trial's cost.
There is no filter-threshold or curriculum-weight knob to move: the dead-group threshold
(filters.DEAD_STD), the std_ema filter's z and the frontier curriculum's floor are constants
of their slot functions, so they move only by choosing another implementation.

Names identify the move and, where it is relative, not the value (`lr_x0.8`,
`temperature_resample`, `advantage_rloo`, `mix_score1_partial0p5`, `partial_weight_x1.25`),
so the skill library pools a relative move across parents and `tried` (per parent) spends
each move once: a resample is one move per knob and parent, never redrawn until it lands.
"""
from __future__ import annotations

import ast
import math
import random
import re
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping

import yaml

from evotrainer.agents.interface import Proposal
from evotrainer.agents.interventions import one_knob
from evotrainer.errors import UsageError
from evotrainer.harness.knobs import Knobs
from evotrainer.harness.load import SLOTS

FACTORS = (0.8, 1.25)  # population-based training's perturbation (Jaderberg et al. 1711.09846)
EXPECT = "raises validation accuracy"


@dataclass(frozen=True)
class Parent:
    """What every move reads: the parent's knobs, the task's target level, the parent's
    harness files (name -> source, knobs.yaml included) and the seed resamples draw with."""
    knobs: Knobs
    target: int
    files: Mapping[str, str] = field(default_factory=dict)
    seed: int = 0


Move = Callable[[Parent], list[Proposal]]


def space(parent: Parent) -> list[Proposal]:
    """Every move of every kind for `parent`: each changes something and leaves the knobs
    valid (a move that would not is left out, not proposed)."""
    return [p for gen in MOVES.values() for p in gen(parent) if _valid(parent.knobs, p)]


def _valid(k: Knobs, p: Proposal) -> bool:
    if all(getattr(k, name) == value for name, value in p.knobs.items()) and not p.files:
        return False  # a move to where the parent already is
    try:
        replace(k, **p.knobs).validate()
    except UsageError:
        return False  # e.g. kl_estimator k1 with kl_coef > 0
    return True


# --------------------------------------------------------------------------- parametric

@dataclass(frozen=True)
class Range:
    """Where a knob may go. `off`: 0 switches its term off, so the range is where it is on,
    and an off knob is switched on at `enable` (by default `lo`, the gentlest setting)."""
    lo: float
    hi: float
    family: str          # the rules agent's family (rules.FAMILY_ORDER): which findings lead to it
    why: str             # what the knob does to training, the hypothesis's reason
    log: bool = False    # resample on a log scale: the knob spans decades
    integer: bool = False
    off: bool = False
    enable: float | None = None

    def clamp(self, x: float) -> float:
        return min(max(x, self.lo), self.hi)

    def tidy(self, x: float):
        """A knob value: an int for integer knobs, else four significant digits (so values
        read well in knobs.yaml and in the lineage)."""
        return int(round(x)) if self.integer else float(f"{x:.4g}")

    def draw(self, rng: random.Random) -> float:
        if self.log:
            return math.exp(rng.uniform(math.log(self.lo), math.log(self.hi)))
        return rng.uniform(self.lo, self.hi)


RANGES: dict[str, Range] = {
    # 1e-3 collapsed the tiny policy (reference knobs.yaml); 1e-7 is below any useful step for it
    "lr": Range(1e-7, 1e-3, "optimisation", "the learning rate sets how far each update moves the policy", log=True),
    "warmup_steps": Range(10, 100, "optimisation", "warm-up keeps the first, least informed updates small",
                          integer=True, off=True),
    # clipping harder than 0.1 or looser than 10 is either every step or never for these models
    "max_grad_norm": Range(0.1, 10.0, "optimisation", "gradient clipping bounds a single batch's pull",
                           log=True, off=True, enable=1.0),
    "weight_decay": Range(1e-3, 0.1, "optimisation", "weight decay pulls weights the reward does not need back",
                          log=True, off=True),
    "kl_coef": Range(1e-3, 0.1, "optimisation", "the KL penalty holds the policy near what the base could do",
                     log=True, off=True),
    "clip_low": Range(0.05, 0.4, "optimisation", "clip_low bounds how far one update may push a token down"),
    "clip_high": Range(0.1, 0.5, "exploration", "clip_high bounds how fast an unlikely token may rise (DAPO)"),
    "temperature": Range(0.5, 1.5, "exploration", "the sampling temperature sets how varied a group's rollouts are"),
    "top_p": Range(0.8, 1.0, "exploration", "nucleus sampling cuts the unlikely tail of each step's choices"),
    "entropy_coef": Range(1e-3, 1e-2, "exploration", "an entropy bonus slows the collapse onto few completions",
                          log=True, off=True),
}

# knobs and slots whose value matters only under a condition on the other knobs
MATTERS: dict[str, Callable[[Knobs], bool]] = {
    "kl_estimator": lambda k: k.kl_coef > 0,            # no KL term, no estimator
    "curriculum": lambda k: len(k.train_levels) > 1,    # one level: nothing to weigh
    # one update per sampled batch: every ratio is 1, so gspo and cispo are the clipped loss
    # and neither clip bound is ever reached
    "policy_loss": lambda k: k.num_iterations > 1,
    "clip_low": lambda k: k.num_iterations > 1,
    "clip_high": lambda k: k.num_iterations > 1,
}


def matters(knob: str, k: Knobs) -> bool:
    return MATTERS.get(knob, lambda _: True)(k)


def perturb(parent: Parent) -> list[Proposal]:
    """x0.8 and x1.25 of every knob that is on, clamped to its range; a clamp that would
    reverse the direction (a parent outside the range) or change nothing is no move."""
    out = []
    for knob, r in RANGES.items():
        now = getattr(parent.knobs, knob)
        if not now or not matters(knob, parent.knobs):
            continue  # off, or 0 on a knob without an off state: a factor of 0 is 0
        for f in FACTORS:
            new = r.tidy(r.clamp(now * f))
            if (new - now) * (f - 1) > 0:
                out.append(one_knob(f"{knob}_x{f}", r.family, knob, old=now, new=new,
                                    why=f"{r.why}, and a x{f} step (as population-based training perturbs) tests "
                                    f"whether the parent's value is past its best; range [{r.lo:g}, {r.hi:g}]",
                                    expect=EXPECT))
    return out


def switch_on(parent: Parent) -> list[Proposal]:
    """An off coefficient switched on at the gentlest setting of its range."""
    out = []
    for knob, r in RANGES.items():
        if r.off and not getattr(parent.knobs, knob) and matters(knob, parent.knobs):
            new = r.tidy(r.lo if r.enable is None else r.enable)
            out.append(one_knob(f"{knob}_on", r.family, knob, old=0, new=new,
                                why=f"{r.why}; it is off in the parent, and switching it on at its gentlest setting "
                                "tests whether the term helps at all", expect=EXPECT))
    return out


def resample(parent: Parent) -> list[Proposal]:
    """One draw per knob from its declared range. The generator is seeded by the parent's seed
    and the knob's name, so a draw is the same for the same seed whatever else is proposed."""
    out = []
    for knob, r in RANGES.items():
        if not matters(knob, parent.knobs):
            continue
        now, new = getattr(parent.knobs, knob), r.tidy(r.draw(random.Random(f"{parent.seed}:{knob}")))
        out.append(one_knob(f"{knob}_resample", r.family, knob, old=now, new=new,
                            why=f"{r.why}, and a draw from its whole range [{r.lo:g}, {r.hi:g}] looks beyond the "
                            "parent's neighbourhood", expect=EXPECT))
    return out


def smaller_groups(parent: Parent) -> list[Proposal]:
    """Half the group size at equal rollouts per step (the catalog's larger_groups, reversed):
    more prompts a step where groups are alive anyway."""
    k = parent.knobs
    if k.group_size < 4 or k.group_size % 2:
        return []  # GRPO needs two rollouts a group, and an odd group does not halve
    p = one_knob("group_size_x0.5", "signal", "group_size", old=k.group_size, new=k.group_size // 2,
             why="where most groups already disagree, more prompts per step cover more of the task at equal "
             "rollouts per step", expect=EXPECT)
    return [replace(p, knobs={"group_size": k.group_size // 2, "prompts_per_step": k.prompts_per_step * 2},
                    frozen="every other knob and slot; rollouts per step (prompts_per_step doubles)",
                    rollback=f"revert group_size to {k.group_size} and prompts_per_step to {k.prompts_per_step}")]


# --------------------------------------------------------------------------- structural

# slot knob -> the family whose findings lead to it (action_parser is a task fit: not searched)
SLOT_FAMILY = {"reward": "reward", "group_filter": "group_filter", "advantage": "signal", "policy_loss": "signal",
               "loss_agg": "signal", "kl_estimator": "optimisation", "curriculum": "curriculum"}
# every knob -> the family it belongs to: what a change reaches, whoever wrote it (a trial in
# flight claims the surfaces its change reaches: evolve/search/specialists.py)
KNOB_FAMILY = {**{k: r.family for k, r in RANGES.items()}, **SLOT_FAMILY, "group_size": "signal",
               "prompts_per_step": "signal", "num_iterations": "optimisation", "steps": "optimisation",
               "top_k": "exploration", "train_levels": "curriculum", "max_new_tokens": "efficiency",
               "action_parser": "other", "clip_delta": "optimisation", "tis_cap": "optimisation",
               "mask_truncated": "efficiency", "top_entropy_quantile": "exploration", "refill_rounds": "group_filter"}


def reach(family: str, knobs: Mapping | None, files: Mapping | None, parent: Knobs) -> frozenset[str]:
    """Every family a change reaches: its own, that of each knob it sets to a new value, and
    that of each harness file it writes (`slot`.py: the slot's; diagnostics.py: diagnostics).
    A catalog or space move stays in its family; an llm or command agent briefed as one
    specialist may edit past that specialist's surface, and then claims what it reached."""
    knobs, files, out = dict(knobs or {}), dict(files or {}), {family}
    if "knobs.yaml" in files:  # an agent's edit of the knobs file: the knobs it changes
        try:
            written = yaml.safe_load(files.pop("knobs.yaml")) or {}
        except yaml.YAMLError:
            written = None
        if isinstance(written, dict):
            knobs = {**written, **knobs}
        else:
            out.add("other")  # unreadable (the legality check refuses it)
    out |= {KNOB_FAMILY.get(k, "other") for k, v in knobs.items()
            if _as_tuple(getattr(parent, k, None)) != _as_tuple(v)}
    out |= {"diagnostics" if f == "diagnostics.py" else KNOB_FAMILY.get(f.removesuffix(".py"), "other") for f in files}
    return frozenset(out)


def _as_tuple(v):
    return tuple(v) if isinstance(v, (list, tuple)) else v


def implementations(slot: str, files: Mapping[str, str]) -> dict[str, str]:
    """Name -> first docstring line of every implementation a harness may name for `slot`:
    the package's registry, then the functions the parent's slot file defines (parsed, not
    imported: nothing here runs harness code)."""
    reg = SLOTS[slot]
    out = {name: _first_line(getattr(reg.get(name), "__doc__", None)) for name in reg.names()}
    for node in _functions(files.get(f"{slot}.py")):
        if not node.name.startswith("_"):
            out[node.name] = _first_line(ast.get_docstring(node))
    return out


def _functions(source: str | None) -> list[ast.FunctionDef]:
    """The top-level functions of a slot file; none where it does not parse (the legality
    check names that file's syntax error: proposing from it is not this module's call)."""
    try:
        return [n for n in ast.parse(source or "").body if isinstance(n, ast.FunctionDef)]
    except (SyntaxError, ValueError):
        return []


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().split("\n")[0] or "no description"


def structural(parent: Parent) -> list[Proposal]:
    """Each slot to every other implementation it has: `advantage_rloo`, `loss_agg_seq_mean_token_sum`."""
    out = []
    for slot, family in SLOT_FAMILY.items():
        if not matters(slot, parent.knobs):
            continue
        now = getattr(parent.knobs, slot)
        for name, doc in implementations(slot, parent.files).items():
            if name != now:
                out.append(one_knob(f"{slot}_{name}", family, slot, old=now, new=name,
                                why=f"{name} does what {now} does not ({doc})", expect=EXPECT))
    return out


# --------------------------------------------------------------------------- composed rewards

@dataclass(frozen=True)
class Part:
    """One typed term of a composed reward: the statements that compute it per rollout (a [B]
    float tensor named `var`) from the Rollouts `r`."""
    var: str
    doc: str
    family: str     # the family a sum led by this part answers
    code: str


PARTS: dict[str, Part] = {
    "score": Part("score", "the verifier score", "reward", "score = r.scores.float()"),
    "partial": Part("partial", "share of answer positions written right (partial_credit's credit)", "reward",
                    "partial = torch.tensor([sum(a == b for a, b in zip(p.answer, c)) / max(len(p.answer), len(c), 1)\n"
                    "                        for p, c in zip(r.problems, r.completions)], dtype=torch.float32)"),
    "length": Part("length", "completion tokens as a share of the budget", "efficiency",
                   "length = r.lengths.float() / max(r.max_new_tokens, 1)"),
    # the format_failure_rate diagnostic's test, turned round: not empty, not cut off, and no
    # kind of character the reference answer never uses
    "format": Part("well_formed", "1 where the completion is well formed, else 0", "reward",
                   "def kinds(text):\n"
                   "    return {'digit' if ch.isdigit() else 'alpha' if ch.isalpha() else 'space' if ch.isspace()\n"
                   "            else 'other' for ch in text}\n"
                   "well_formed = torch.tensor([float(bool(c.strip()) and not t and kinds(c) <= kinds(p.answer))\n"
                   "                            for p, c, t in zip(r.problems, r.completions, r.truncated.tolist())])"),
}
DOC_HEAD = "Composed reward:"  # the docstring's first line carries the spec, so a child can read it back


@dataclass(frozen=True)
class Term:
    part: str       # a key of PARTS
    weight: float


@dataclass(frozen=True)
class RewardSpec:
    """A weighted sum of parts. The score leads with weight 1: under group normalisation only
    the other weights' ratio to it matters, so those are what moves."""
    terms: tuple[Term, ...]

    @property
    def name(self) -> str:
        return "mix_" + "_".join(f"{t.part}{_ident(t.weight)}" for t in self.terms)

    @property
    def family(self) -> str:
        return next((PARTS[t.part].family for t in self.terms if t.part != "score"), "reward")

    def line(self) -> str:
        return " ".join(f"{t.part}={t.weight!r}" for t in self.terms)


def _ident(w: float) -> str:
    """A weight as part of a Python name: 0.5 -> 0p5, -0.1 -> m0p1, 1e-05 -> 1em05."""
    return f"{w:g}".replace("-", "m").replace(".", "p").replace("+", "")


def render(spec: RewardSpec) -> str:
    """The reward function's source: self-contained (it imports torch itself), so it can be
    appended to any reward.py, and the lineage's diff shows all it computes."""
    body = ["import torch"] + [line for t in spec.terms for line in PARTS[t.part].code.split("\n")]
    total = " ".join(f"{'-' if t.weight < 0 else '+'} {abs(t.weight)!r} * {PARTS[t.part].var}" for t in spec.terms)
    total = total[2:] if total.startswith("+ ") else total
    return "\n".join([f"def {spec.name}(r):", f'    """{DOC_HEAD} {spec.line()}',
                      "", "    A weighted sum of typed parts, written by the search space (agents/space.py).", '    """',
                      *(f"    {line}" for line in body), f"    return {total}"]) + "\n"


def composed(source: str | None) -> dict[str, RewardSpec]:
    """Name -> spec of every composed reward in a reward.py, read back from its docstring and
    counted only where the function is exactly what `render` writes (one edited by hand is
    the harness's own reward, not the space's to reweigh)."""
    out = {}
    for node in _functions(source):
        head = (ast.get_docstring(node) or "").split("\n")[0]
        m = re.fullmatch(rf"{re.escape(DOC_HEAD)} ((?:\w+=\S+ ?)+)", head)
        if not m:
            continue
        try:
            spec = RewardSpec(tuple(Term(p, float(w)) for p, w in (kv.split("=") for kv in m.group(1).split())))
        except ValueError:
            continue
        if all(t.part in PARTS for t in spec.terms) and ast.get_source_segment(source, node) + "\n" == render(spec):
            out[node.name] = spec
    return out


# the composed rewards every parent may try: (spec, why)
COMPOSED: tuple[tuple[RewardSpec, str], ...] = (
    (RewardSpec((Term("score", 1.0), Term("partial", 0.5))),
     "credit for the positions written right keeps groups alive while an exact answer still pays most"),
    (RewardSpec((Term("score", 1.0), Term("format", 0.2))),
     "a small format term separates well-formed wrong answers from malformed ones, so fewer groups tie"),
    (RewardSpec((Term("score", 1.0), Term("length", -0.1))),
     "a small cost per share of the budget cuts over-long completions while correctness still dominates"),
)


def _reward_move(parent: Parent, intervention: str, spec: RewardSpec, why: str) -> list[Proposal]:
    source = parent.files.get("reward.py", "")
    p = one_knob(intervention, spec.family, "reward", old=parent.knobs.reward, new=spec.name,
             why=f"{why} (reward = {spec.line()})", expect=EXPECT)
    if spec.name in implementations("reward", parent.files):
        # already written (setting the knob is the whole change), unless the name is taken by
        # something else: a function edited by hand is not this spec
        return [p] if composed(source).get(spec.name) == spec else []
    head = source.rstrip("\n") + "\n\n\n" if source.strip() else \
        "# Rewards composed by the search space (evotrainer/agents/space.py): weighted sums of typed parts.\n\n\n"
    return [replace(p, files={"reward.py": head + render(spec)})]


def composed_rewards(parent: Parent) -> list[Proposal]:
    """The fixed composed rewards (`mix_score1_partial0p5`, ...), as new reward functions."""
    return [p for spec, why in COMPOSED for p in _reward_move(parent, spec.name, spec, why)]


def reweigh(parent: Parent) -> list[Proposal]:
    """Where the parent's reward is a composed one: each non-score weight x0.8 and x1.25."""
    spec = composed(parent.files.get("reward.py")).get(parent.knobs.reward)
    if spec is None:
        return []
    out = []
    for i, t in enumerate(spec.terms):
        if t.part == "score":
            continue
        for f in FACTORS:
            new = replace(spec, terms=spec.terms[:i] + (Term(t.part, float(f"{t.weight * f:.4g}")),) + spec.terms[i + 1:])
            out += _reward_move(parent, f"{t.part}_weight_x{f}", new,
                                f"the parent's composed reward, with the {t.part} weight x{f}, tests whether "
                                "the term is weighed right")
    return out


# --------------------------------------------------------------------------- the registry

# kind of move -> its generator, in the order the rules agent tries them within a family: local
# steps first (perturb, reweigh), then switches and new parts, then resamples (the farthest jumps)
MOVES: dict[str, Move] = {fn.__name__: fn for fn in (
    perturb, reweigh, switch_on, smaller_groups, structural, composed_rewards, resample)}

"""Any reasoning-gym procedural family as a task: `rg:chain_sum`, `rg:basic_arithmetic`, ...

Problems come from the family's own generator (seeded, so splits are reproducible) and
are scored by the family's own `score_answer`. Note: some families give partial credit
when the oracle answer is a substring of the completion; that is the family's scorer and
we keep it, but reward shaping in a harness should not lean on it.

Levels: without one (or 0) a family is its default config, one level 0. Level L >= 1 is
step L-1 of the family's own curriculum (reasoning-gym's `create_curriculum`, every
attribute at that step), so `rg:chain_sum` level 1 is 2 terms of 1 digit and level 2 is
2-3 terms of 1-2 digits; the levels below the target are what a curriculum harness mixes in.

Datasets: one per level, built on first use and kept. A reasoning-gym item is a pure function
of (seed, index), and a dataset's construction does not depend on its size for almost every
family, so each level is one dataset of `DATASET_SIZE` items with a seed fixed by the task, and
a draw is `ds[rng.randrange(size)]`, not a new dataset per draw. The four families whose
constructors do work per item get a smaller size (SIZE_CAPS).

`rg:composite` is reasoning-gym's weighted mix of families, each at its defaults, every item
scored by its own family: `rg:composite?families=chain_sum,basic_arithmetic:2` (a weight after
a colon, 1 if none). Without `families` it is COMPOSITE_DEFAULT. It has one level (0).
"""
from __future__ import annotations

import functools
import hashlib
import random

import reasoning_gym
from reasoning_gym.factory import create_curriculum, has_curriculum

from evotrainer.errors import UsageError, unknown
from evotrainer.tasks.base import Problem, Task, budget_from_answers

# seed + index stays below 2**32 (numpy's seed limit, which some families use per item)
DATASET_SIZE = 2**31 - 1
# families whose constructor does work per item (or refuses large sizes): a size they build
# in well under a second, still far more items than a run draws
SIZE_CAPS = {
    "acre": 2_000,               # generates every question up front
    "gsm_symbolic": 1_000_000,   # draws a template index per item up front
    "list_functions": 1_000_000,  # likewise
    "word_ladder": 20_000,       # its config refuses more
}
BUDGET_SAMPLE = 64  # items of the target level whose longest answer sets the completion budget
# The default base's SFT cap. SFT pays for every batch padded to its longest row: at
# chain_sum's ~120 characters (question and answer), 500 steps of 32 took 143 s on 2 cores,
# and rg:composite's default mix, whose leg_counting questions (~270 characters) pad most
# batches, took 362 s for the same 500. So a family gets SFT_CHARS characters of its longest
# row's length in steps, between the bounds: every family's base builds in about the same time.
SFT_CHARS = 500 * 120
SFT_STEPS = (100, 500)
# rg:composite without `families`: three short-answer numeric families, equally weighted
COMPOSITE_DEFAULT = "basic_arithmetic:1,chain_sum:1,leg_counting:1"
QUERY_KEYS = ("families",)  # only rg:composite takes it


def families() -> list[str]:
    from reasoning_gym.factory import DATASETS
    return sorted(DATASETS)


def parse_mix(families_option: str | None) -> tuple[tuple[str, float], ...]:
    """`a,b:2` -> (("a", 1.0), ("b", 2.0)): rg:composite's families and weights, checked."""
    text = COMPOSITE_DEFAULT if families_option is None else families_option
    known = [f for f in families() if f != "composite"]
    mix: list[tuple[str, float]] = []
    for part in text.split(","):
        name, _, weight = part.strip().partition(":")
        if name not in known:
            raise unknown("reasoning-gym family in rg:composite's families", name, known)
        try:
            w = float(weight) if weight else 1.0
        except ValueError:
            w = -1.0
        if not w > 0 or w == float("inf"):
            raise UsageError(f"weight of {name} in rg:composite's families must be a positive number, got '{weight}'")
        if name in dict(mix):
            raise UsageError(f"{name} is named twice in rg:composite's families")
        mix.append((name, w))
    return tuple(mix)


def mix_text(mix: tuple[tuple[str, float], ...]) -> str:
    """The canonical `families` value: every weight written, in the order given (it is the
    order reasoning-gym samples by)."""
    return ",".join(f"{n}:{w:g}" for n, w in mix)


def level_configs(family: str) -> list[dict]:
    """Config overrides per level: [{}] (level 0, the defaults), then one per curriculum step."""
    out: list[dict] = [{}]
    if not has_curriculum(family):
        return out
    cur = create_curriculum(family)
    for level in range(max(len(a.levels) for a in cur.attributes.values())):
        for name, attr in cur.attributes.items():
            cur.set_attr_level(name, min(level, len(attr.levels) - 1))
        cfg = cur.generate_configuration()
        out.append({k: getattr(cfg, k) for k in vars(cfg) if k not in ("seed", "size")})
    return out


class ReasoningGymTask(Task):
    # The default base, for a run that names no model: SFT of the built-in 1M-parameter
    # character model, which learns some families and not others, so it is capped
    # (sft_max_steps) and kept whatever its probe reached (`rg:chain_sum` at its defaults was
    # still short of 25% after 420 s of SFT from scratch; with the target required, a family out
    # of its reach would fail after 1500 steps and three restarts). A family's questions are
    # long (a step of 128 took 1.3 s on chain_sum, arith's 0.16 s), so batches are smaller. A
    # config asks for more with `base.max_steps`, `base.batch_size` and `base.require_target`,
    # or names a real model.
    sft_batch_size = 32
    sft_require_target = False

    def __init__(self, family: str, level: int | None = None, split_size: int = 200,
                 max_new_tokens: int | None = None, mix: tuple[tuple[str, float], ...] | None = None):
        if family not in families():
            raise unknown("reasoning-gym family", family, families())
        self.family, self.configs = family, level_configs(family)
        self.name = self.spec = f"rg:{family}"
        self.mix = None
        if family == "composite":
            from reasoning_gym.composite import DatasetSpec
            self.mix = mix or parse_mix(None)
            self.configs = [{"datasets": [DatasetSpec(n, w, {}) for n, w in self.mix]}]
        self.target_level = level or 0
        if not 0 <= self.target_level < len(self.configs):
            steps = f"1..{len(self.configs) - 1} (its reasoning-gym curriculum)" if len(self.configs) > 1 else "none"
            raise UsageError(f"level {self.target_level} is not a level of {self.name}; valid levels: "
                             f"0 (the family's defaults) or {steps}")
        # the defaults stand alone; curriculum levels are a ladder a curriculum can mix
        self.levels = (0,) if self.target_level == 0 else tuple(range(1, len(self.configs)))
        self.split_size = split_size
        self.size = min(SIZE_CAPS.get(f, DATASET_SIZE) for f in ([n for n, _ in self.mix] if self.mix else [family]))
        self._datasets: dict[int, object] = {}
        # the family decides the budget: the longest of a fixed sample of target-level answers
        # plus slack (budget_from_answers); the built-in character model writes one token per
        # character, models that reason first pass `?max_new_tokens=N` in the spec instead
        if max_new_tokens is None:
            max_new_tokens = budget_from_answers(str(e["answer"]) for e in self._fixed_sample)
        self.max_new_tokens = max_new_tokens

    @functools.cached_property
    def _fixed_sample(self) -> list[dict]:
        """BUDGET_SAMPLE items of the target level, the same for every run of the family and level
        (drawn once: the budget and the SFT cap both read it)."""
        rng = random.Random(f"{self.name}/budget/{self.target_level}")
        ds = self._dataset(self.target_level)
        return [ds[rng.randrange(self.size)] for _ in range(BUDGET_SAMPLE)]

    @functools.cached_property
    def sft_max_steps(self) -> int:
        """The default base's SFT cap: SFT_CHARS over the longest row of the fixed sample (a
        batch's longest, about), within SFT_STEPS."""
        longest = max(len(e["question"]) + len(str(e["answer"])) for e in self._fixed_sample)
        return max(SFT_STEPS[0], min(SFT_STEPS[1], SFT_CHARS // longest))

    def _dataset(self, level: int):
        """The level's dataset, built once; its seed is fixed by (family, level)."""
        if level not in self._datasets:
            seed = int.from_bytes(hashlib.sha256(f"{self.name}/{level}".encode()).digest()[:4], "big") % 2**31
            self._datasets[level] = reasoning_gym.create_dataset(self.family, size=self.size, seed=seed,
                                                                 **self.configs[level])
        return self._datasets[level]

    def problem_space(self, level: int) -> int:
        # procedural families are effectively unbounded (at the levels we train); a capped
        # dataset holds at most its size
        return min(10 ** 9, self.size)

    def generate(self, rng: random.Random, level: int) -> Problem:
        entry = self._dataset(level)[rng.randrange(self.size)]
        return Problem(id=entry["question"], prompt=entry["question"] + "\nAnswer: ",
                       answer=str(entry["answer"]), level=level, entry=entry)

    def score(self, problem: Problem, completion: str) -> float:
        # the scorer of the problem's own level: a few families score against their config
        level = problem.level if 0 <= problem.level < len(self.configs) else self.target_level
        return float(self._dataset(level).score_answer(answer=completion.strip(), entry=problem.entry))

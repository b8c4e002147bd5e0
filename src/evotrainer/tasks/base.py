"""What a task is: prompts, a fixed verifier, and three disjoint splits.

The verifier's output is the *score* (correct or not). It is fixed per task and never
depends on the harness; the harness turns scores into *rewards* on its own.

Which problems may ever be held out is public: a plain SHA-256 of the problem's name, level
and id puts one problem in `HELD_OUT_SHARE` into the held-out pool, and training streams
skip that pool. Which pool problems are validation and which are test is the secret: both
are drawn from the pool in an order seeded with the run's key (`Task.key`, a secret of the
base, tasks/keys.py). The training data is therefore the same under every key, and so is
everything a training worker receives: the controller hands it its training problems as
indices (`train_draws`), which it rebuilds (`HandedStream`). Why the pool itself cannot be
the secret: whatever excludes a secret pool from training reveals that pool by its
complement (the gaps in a handed index list were exactly the held-out problems). What the
public pool leaves open, with numbers, is in docs/tasks.md.

Training problem `i` of level `L` in stream `seed` is `generate(Random("name/train/seed/L/i"))`:
a problem depends on its index alone, so a list of indices is all a worker needs.
"""
from __future__ import annotations

import functools
import hashlib
import hmac
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from evotrainer.tasks.spec import spec_files

SPLIT_SEEDS = {"val": 10_000_001, "test": 20_000_002}  # train streams use the run's seed
SPLITS = ("val", "test")
HELD_OUT_SHARE = 4  # one problem in four belongs to the held-out pool (256 divides evenly)


@dataclass(frozen=True)
class Problem:
    id: str          # stable key: the same problem always has the same id
    prompt: str
    answer: str      # reference answer, as the policy should write it
    level: int       # difficulty level (digits for arith; 0 where a task has one level)
    entry: Any = field(default=None, compare=False, repr=False)  # verifier's private data


@dataclass(frozen=True)
class Judgement:
    """The verifier's verdict on one completion: its score, and for tasks that run programs
    what happened (kept in the evidence, read by the code diagnostics)."""
    score: float
    outcome: str | None = None   # passed, failed, syntax_error, runtime_error, timeout, memory
    failure: str | None = None   # the kind of failure: an exception type, "wrong output", "timeout"


class Task(ABC):
    """A task family. Subclasses generate problems; splits and streams come from here."""

    name: str             # stable identity: hashes splits and streams (never a path)
    spec: str             # canonical spec string: get_task(spec, level) rebuilds this task anywhere
    levels: tuple[int, ...]
    target_level: int
    max_new_tokens: int   # completion budget the task needs (answer + end token, with slack)
    split_size: int = 500
    # SFT checks its probe every this many steps (pretrain.py): a task whose accuracy jumps
    # within a few steps needs finer checks for the stop to land inside the jump (vault's
    # went from 2% to 93% between two checks 10 steps apart)
    sft_check_every: int = 10
    sft_probe_size: int = 200  # problems a check draws (a multi-turn task's episodes cost more)
    # The SFT probe samples at this temperature; 0: greedy. What RL sees is sampled, and a
    # multi-turn base can be right greedily and wrong when sampled: a vault base probed 37%
    # greedy and 0.6% at temperature 1, and RL from it collapsed on 2 of 3 seeds
    # (bench/task_learning.py). Single-turn tasks keep greedy (and their cached bases).
    sft_probe_temperature: float = 0.0
    sft_target_acc: float = 0.25  # the SFT stop's probe accuracy, unless a config names its own
    # The rest of the default base's recipe (pretrain.py), for a run that names no model and
    # no other: SFT continued from the default base of level `sft_warm_start` (0: from
    # scratch), at most `sft_max_steps` steps of `sft_batch_size`; `sft_require_target`
    # False keeps the model SFT reached by then, short of the target or not.
    sft_warm_start: int = 0
    sft_max_steps: int = 1500
    sft_batch_size: int = 128
    sft_require_target: bool = True
    # SFT steps building that base took when measured from an empty cache (this stage only,
    # not its warm start): the estimate said before SFT starts, and the progress bar's length
    # (its ETA follows the machine's pace). 0: not measured.
    sft_typical_steps: int = 0
    key: bytes | None = None  # orders the val/test draws (tasks/keys.py); None: a public order (tests, library use)
    _draws: dict[int, list[int]] | None = None  # a worker's handed-in training indices (use_draws)

    @abstractmethod
    def generate(self, rng: random.Random, level: int) -> Problem:
        """Draw one problem of the given level from rng."""

    @abstractmethod
    def problem_space(self, level: int) -> int:
        """How many distinct problems the level has (an upper bound is fine)."""

    @abstractmethod
    def score(self, problem: Problem, completion: str) -> float:
        """The verifier: 1.0 if the completion solves the problem, else 0.0 (or in [0, 1])."""

    def sft_measured_steps(self, target_acc: float) -> int:
        """SFT steps this level's default base recipe took to stop at `target_acc` when
        measured (that stage alone); 0: not measured. A task that measured other targets says so."""
        return self.sft_typical_steps if target_acc == self.sft_target_acc else 0

    def judge_many(self, problems: list[Problem], completions: list[str]) -> list[Judgement]:
        """Verdicts on a whole batch: one call per training step and evaluation batch, so a
        task that runs programs starts its sandbox once per batch, not once per completion."""
        return [Judgement(self.score(p, c)) for p, c in zip(problems, completions)]

    def score_many(self, problems: list[Problem], completions: list[str]) -> list[float]:
        return [j.score for j in self.judge_many(problems, completions)]

    def credit(self, score: float) -> float:
        """What the evaluator counts for a score: the score itself, unless a task says a
        partial score is not a solve (codegen: correct only when every test passes)."""
        return score

    def split(self, which: str, level: int | None = None, n: int | None = None) -> list[Problem]:
        """Validation or test problems: drawn from the public held-out pool in an order the key
        seeds (which pool problems are scored is the secret), no duplicates, disjoint."""
        if which not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {which!r}")
        level = self.target_level if level is None else level
        # both splits must fit in the pool (1-digit sums: 100 problems, a pool of ~25)
        full = min(self.split_size, self.problem_space(level) // HELD_OUT_SHARE // 2)
        n = full if n is None else min(n, full)
        # test excludes the *whole* validation split, so a test subset never meets validation
        exclude = set() if which == "val" else {p.id for p in self.split("val", level)}
        secret = f"/{self.key.hex()}" if self.key else ""  # the draw order: which pool problems are scored
        rng = random.Random(f"{self.name}/{which}/{level}/{SPLIT_SEEDS[which]}{secret}")
        return self._draw_unique(rng, level, full, exclude)[:n]

    def held_out(self, problem: Problem) -> bool:
        """Whether the problem is in the held-out pool (validation and test come from it only).
        Public, never keyed: training skips the pool, so a keyed pool would show in what
        training is handed (an override must not read `self.key` either)."""
        return pool_digest(self.name, problem)[0] % HELD_OUT_SHARE == 0

    def use_key(self, key: bytes) -> None:
        """Seed the val/test draws with the run's secret (the controller and the evaluator do)."""
        self.key = key

    def train_problem(self, seed: int, level: int, index: int) -> Problem:
        """Training problem `index` of `level` in stream `seed` (held out or not: callers filter)."""
        return self.generate(random.Random(f"{self.name}/train/{seed}/{level}/{index}"), level)

    def train_stream(self, seed: int) -> "TrainStream | HandedStream":
        """The training problems of stream `seed`: the handed-in ones in a worker, else drawn here."""
        return TrainStream(self, seed) if self._draws is None else HandedStream(self, seed, self._draws)

    def use_draws(self, draws: dict[int, list[int]]) -> None:
        """A worker's task: train only on these indices (per level), drawn by the controller."""
        self._draws = {int(lv): list(ix) for lv, ix in draws.items()}

    def train_spec(self, directory: Path) -> str:
        """The spec a training worker gets: this one (a generator holds no held-out data; a
        task whose file does writes its training rows under `directory`, see jsonl.py)."""
        return self.spec

    def data_files(self) -> tuple[str, ...]:
        """Files that hold held-out problems (a JSONL task's rows): hidden from harness code."""
        return ()

    def files(self, spec: str | None = None) -> tuple[str, ...]:
        """The files a job that rebuilds this task from `spec` reads (this task's own spec, or
        a train spec of it): those the spec names as paths (tasks/spec.py `spec_files`: a
        JSONL file, a factory's .py file, an environment's rows), what the job's Call
        declares in `reads`. The spec itself is never handed to the sandbox: a string cut
        at its punctuation would name a directory beside the file, or no file at all."""
        return spec_files(self.spec if spec is None else spec)

    def _draw_unique(self, rng, level, n, exclude) -> list[Problem]:
        out, seen, tries = [], set(exclude), 0
        while len(out) < n:
            p = self.generate(rng, level)
            tries += 1
            if p.id not in seen and self.held_out(p):
                seen.add(p.id)
                out.append(p)
            if tries > 50 * HELD_OUT_SHARE * n:  # tiny problem spaces run out of distinct items
                break
        return out


def pool_digest(task_name: str, problem: Problem, key: bytes | None = None) -> bytes:
    """Plain SHA-256 of the problem (without `key`: the public held-out rule), or HMAC-SHA256
    under `key` (a secret order, as a JSONL task's val/test assignment uses)."""
    msg = f"{task_name}/{problem.level}/{problem.id}".encode()
    return hmac.new(key, msg, hashlib.sha256).digest() if key else hashlib.sha256(msg).digest()


def budget_from_answers(answers) -> int:
    """Default completion budget from reference answers: the longest, plus half again (at least 4).

    The built-in character model writes one token per character, so the longest answer plus
    the end token is the least it needs; the slack lets over-long answers show up as wrong
    rather than cut off. Models that reason before answering need far more: they pass
    `?max_new_tokens=N` in the task spec.
    """
    longest = max((len(a) for a in answers), default=0)
    return longest + max(4, longest // 2)


class TrainStream:
    """Endless training problems for any level, never one from the held-out pool."""

    def __init__(self, task: Task, seed: int):
        self.task, self.seed = task, seed
        self.next: dict[int, int] = {}  # per level: the next index to try

    def index(self, level: int) -> int:
        """The index of the next training problem of `level` (held-out indices skipped)."""
        while True:
            i = self.next.get(level, 0)
            self.next[level] = i + 1
            if not self.task.held_out(self.task.train_problem(self.seed, level, i)):
                return i

    def draw(self, level: int) -> Problem:
        return self.task.train_problem(self.seed, level, self.index(level))

    def batch(self, levels: list[int]) -> list[Problem]:
        return [self.draw(lv) for lv in levels]

    def __iter__(self) -> Iterator[Problem]:
        while True:
            yield self.draw(self.task.target_level)


class HandedStream(TrainStream):
    """A worker's stream: the controller's indices, in order; it never computes `held_out`."""

    def __init__(self, task: Task, seed: int, draws: dict[int, list[int]]):
        super().__init__(task, seed)
        self.draws = draws

    def index(self, level: int) -> int:
        i = self.next.get(level, 0)
        ix = self.draws.get(level, [])
        if i >= len(ix):
            raise RuntimeError(f"{self.task.name}: the {len(ix)} training problems handed in for level {level} "
                               f"are used up (the controller draws steps x prompts_per_step per level)")
        self.next[level] = i + 1
        return ix[i]


def train_draws(task: Task, seed: int, per_level: int, levels: tuple[int, ...] | None = None) -> dict[int, list[int]]:
    """The controller's side of HandedStream: `per_level` training indices for each of
    `levels` (None: every level of the task). The same under any key or none: the pool they
    skip is public. Kept: every version at one depth trains on the same seeds (the lists are
    shared, never to be changed)."""
    return {lv: _draws(task, seed, per_level, lv) for lv in (task.levels if levels is None else levels)}


@functools.lru_cache(maxsize=64)
def _draws(task: Task, seed: int, per_level: int, level: int) -> list[int]:
    stream = TrainStream(task, seed)
    return [stream.index(level) for _ in range(per_level)]

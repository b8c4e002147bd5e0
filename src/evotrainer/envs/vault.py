"""Look values up in a vault with a tool, then answer: a tool-use task a tiny policy learns on a CPU.

    prompt        add b d
    policy        look b            (a tool call: the `plain` action format)
    environment   b=47
    policy        look d
    environment   d=13
    policy        answer 60

Each problem hides two-digit values (10-99) behind single-letter keys; the prompt names the
keys and what to do with them. The values appear nowhere but in the tool's answers, so a
policy that does not call the tool answers a level-1 problem with probability 1/90 at best:
the expected reward without the tool is near zero by construction. `vault?tool=off` locks
the tool (every call fails), for that control.

Levels:
    1  find b          one lookup, copy the value
    2  get b d         two lookups, both values in order ("47 13")
    3  add b d         two lookups and their sum
    4  add b d f       three lookups and their sum
An episode ends at the answer (success or fail; an answer before any lookup is an
`abandon`), at an action that is no tool call (`invalid_action`), at an action that repeats
the last observation (`echo`), or at a cap.
"""
from __future__ import annotations

import random
import string
from dataclasses import dataclass

from evotrainer.envs.base import (ABANDON, ECHO, FAIL, INVALID, SUCCESS, Caps, EnvTask, Environment, Parser, Step,
                                  ToolCall)
from evotrainer.tasks.base import Problem
from evotrainer.tasks.registry import Builtin, Option, register

KEYS = string.ascii_lowercase
VALUES = range(10, 100)
VERB = {1: "find", 2: "get", 3: "add", 4: "add"}
LOOKUPS = {1: 1, 2: 2, 3: 2, 4: 3}
TOOLS = {"look": ("key",), "answer": ("value",)}


@dataclass
class VaultConfig:
    target_level: int = 2
    split_size: int = 500
    tool: bool = True           # False: the vault is locked (the no-tool control)

    def validate(self) -> None:
        if self.target_level not in VERB:
            raise ValueError(f"vault level must be one of {', '.join(map(str, VERB))}, got {self.target_level}")
        if self.split_size < 1:
            raise ValueError(f"split_size must be positive, got {self.split_size}")


@dataclass(frozen=True)
class Vault:
    """A problem's hidden data: the keys asked for and their values (the verifier's entry)."""
    keys: tuple[str, ...]
    values: tuple[int, ...]

    def answer(self, level: int) -> str:
        return " ".join(map(str, self.values)) if level <= 2 else str(sum(self.values))


class VaultEnv(Environment):
    tools = TOOLS

    def __init__(self, problem: Problem, parse: Parser, caps: Caps, tool: bool):
        super().__init__()
        self.problem, self.parse, self.caps, self.tool = problem, parse, caps, tool
        self.vault: Vault = problem.entry
        self.last = ""

    def reset(self, seed: int) -> str:
        return self.problem.prompt

    def step(self, action: str) -> Step:
        if self.last and action.strip() == self.last.strip():  # checked first: an echo rarely parses
            self.trace.tools.append("echo")
            return Step("", 0.0, True, False, {"stop": ECHO})
        call = self.parse(action, self.tools)
        if call is None:
            self.trace.tools.append("invalid")
            self.trace.failures += 1
            return Step("", 0.0, True, False, {"stop": INVALID})
        self.trace.tools.append(call.name)
        if call.name == "answer":
            return self._answer(call)
        self.last = self._look(call)
        return Step(self.last, 0.0, False, False, {"tool": "look"})

    def _look(self, call: ToolCall) -> str:
        key = call.args["key"].strip()
        if not self.tool:
            self.trace.failures += 1
            return "locked\n"
        if key not in self.vault.keys:
            self.trace.failures += 1
            return f"no {key[:4]}\n"
        return f"{key}={self.vault.values[self.vault.keys.index(key)]}\n"

    def _answer(self, call: ToolCall) -> Step:
        right = call.args["value"].strip() == self.problem.answer
        looked = "look" in self.trace.tools
        stop = SUCCESS if right else FAIL if looked else ABANDON
        return Step("", 1.0 if right else 0.0, True, False, {"stop": stop, "tool": "answer"})


class VaultTask(EnvTask):
    sft_check_every = 2  # SFT learns to copy the asked-for key all at once: 2% to 93% in 10 steps
    sft_probe_temperature = 1.0  # the stop reads accuracy as RL samples it (tasks/base.py)
    # 10% sampled: a group of 8 has a success 57% of the time. Bases at 5.1% and 12.9% sampled
    # learned on all seeds, one at 0.6% collapsed on two of three; 25% sampled was 100% greedy
    sft_target_acc = 0.10

    def __init__(self, config: VaultConfig | None = None):
        self.config = config or VaultConfig()
        self.config.validate()
        self.name = "vault"
        self.spec = "vault" if self.config.tool else "vault?tool=off"
        self.levels = tuple(VERB)
        self.target_level = self.config.target_level
        self.split_size = self.config.split_size
        n = LOOKUPS[self.target_level]
        # turns: the lookups, the answer and one spare; tokens: a 1M-parameter model's 512 positions are plenty
        self.caps = Caps(max_turns=n + 2, max_tokens=128, turn_tokens=12)
        # the default level's base took 202 SFT steps from an empty cache (bench/first_step.py)
        self.sft_typical_steps = 200 if self.target_level == VaultConfig().target_level else 0

    def problem_space(self, level: int) -> int:
        n = LOOKUPS[level]
        return len(KEYS) ** n * len(VALUES) ** n

    def generate(self, rng: random.Random, level: int) -> Problem:
        keys = tuple(rng.sample(KEYS, LOOKUPS[level]))
        vault = Vault(keys, tuple(rng.choice(VALUES) for _ in keys))
        pid = ",".join(f"{k}={v}" for k, v in zip(keys, vault.values))
        return Problem(id=pid, prompt=f"{VERB[level]} {' '.join(keys)}\n", answer=vault.answer(level), level=level,
                       entry=vault)

    def environment(self, problem: Problem, parse: Parser) -> VaultEnv:
        return VaultEnv(problem, parse, self.caps, self.config.tool)

    def sft_task(self) -> "VaultTask":
        return self if self.config.tool else VaultTask(VaultConfig(self.target_level, self.split_size, tool=True))

    def demonstration(self, problem: Problem) -> list[tuple[str, str]]:
        v: Vault = problem.entry
        return [(f"look {k}", f"{k}={x}\n") for k, x in zip(v.keys, v.values)] + [(f"answer {problem.answer}", "")]


def make(level: int | None = None, tool: bool = True) -> VaultTask:
    cfg = VaultConfig(tool=tool) if level is None else VaultConfig(target_level=level, tool=tool)
    return VaultTask(cfg)


def _from_spec(level: int | None, tool: str) -> VaultTask:
    return make(level, tool=tool == "on")


register(Builtin("vault", _from_spec, (Option("tool", ("on", "off"), "on"),)))  # vault?tool=off: the control

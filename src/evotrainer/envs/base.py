"""Environments: what a multi-turn task is, in the shape the major frameworks share.

    obs = env.reset(seed)                       # the first observation: the task's prompt
    obs, reward, terminated, truncated, info = env.step(action)
    env.close()

As in gym (and ROLL's gem envs, verl's agent loop, SkyRL-gym, rllm, TRL's environment
factory): text in and out; `terminated` when the episode ended on its own (solved, failed,
submitted), `truncated` when a cap cut it (turns or tokens), recorded apart. The trainer owns
the token ids: it never re-tokenizes the history (`episode.py`). A GRPO group plays one seed.
A single-turn task is an environment with one turn (`SingleTurn`).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from evotrainer.tasks.base import Problem, Task


@dataclass(frozen=True)
class Step:
    """What `step` returns (the gym tuple, with names)."""
    observation: str           # what the environment answers (a tool's output, a message); "" at the end
    reward: float              # the outcome reward, nonzero on the last step only in our tasks
    terminated: bool           # the episode ended on its own
    truncated: bool            # a cap ended it
    info: dict = field(default_factory=dict)  # stop reason, tool calls by kind, tool failures, ...


@dataclass(frozen=True)
class Caps:
    """The caps of an episode: policy turns, and tokens of the whole history (prompt,
    policy turns and observations together)."""
    max_turns: int = 8
    max_tokens: int = 2048

    def validate(self) -> None:
        if self.max_turns < 1 or self.max_tokens < 1:
            raise ValueError(f"max_turns and max_tokens must be >= 1, got {self.max_turns} and {self.max_tokens}")


class Environment(ABC):
    caps: Caps = Caps()

    @abstractmethod
    def reset(self, seed: int) -> str:
        """Start an episode; the first observation (the prompt)."""

    @abstractmethod
    def step(self, action: str) -> Step:
        """Play one policy turn (its text, end token excluded)."""

    def close(self) -> None:
        """Release what the episode holds (a workspace, a sandbox)."""


class SingleTurn(Environment):
    """A single-turn task as an environment: the prompt, one answer, the verifier's score."""

    caps = Caps(max_turns=1)

    def __init__(self, task: Task, problem: Problem):
        self.task, self.problem = task, problem

    def reset(self, seed: int) -> str:
        return self.problem.prompt

    def step(self, action: str) -> Step:
        score = self.task.score(self.problem, action)
        return Step("", score, True, False, {"stop": "success" if score >= 1 else "fail"})

"""Environments: what a multi-turn task is, in the shape the major frameworks share.

    obs = env.reset(seed)                       # the first observation: the task's prompt
    obs, reward, terminated, truncated, info = env.step(action)
    env.close()

As in gym (and ROLL's gem envs, verl's agent loop, SkyRL-gym, rllm, TRL's environment
factory): text in and out; `terminated` when the episode ended on its own (solved, failed,
submitted), `truncated` when a cap cut it (turns or tokens), recorded apart. The trainer owns
the token ids and the caps (it counts tokens): it never re-tokenizes the history
(`episode.py`), and when a cap ends an episode it asks the environment for the reward of
the state as it stands (`truncate`). A GRPO group plays one seed.
A single-turn task is an environment with one turn (`SingleTurn`).

An action is the policy's text; how it is read as a tool call is the harness's choice
(`parse`, the `action_parser` slot: harness/actions.py), so the loop can evolve it.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, Mapping

from evotrainer.tasks.base import Problem, Task

# How an episode ends (the `stop` of its last step's info; EvoTrainer's stop reasons):
SUCCESS, FAIL = "success", "fail"              # ended on its own, solved or not
TURN_CAP, TOKEN_CAP = "turn_cap", "token_cap"  # truncated by a cap
INVALID = "invalid_action"                     # the action parsed as no tool the environment has
ECHO = "echo"                                  # the policy repeated an observation back (an echo trap)
ABANDON = "abandon"                            # ended on its own without any work (answered or submitted blind)
STOPS = (SUCCESS, FAIL, TURN_CAP, TOKEN_CAP, INVALID, ECHO, ABANDON)


@dataclass(frozen=True)
class ToolCall:
    name: str
    args: dict[str, str] = field(default_factory=dict)


# tool name -> its parameter names, in order (what a parser needs to read positional arguments)
Tools = Mapping[str, tuple[str, ...]]
Parser = Callable[[str, Tools], "ToolCall | None"]


@dataclass(frozen=True)
class Step:
    """What `step` returns (the gym tuple, with names)."""
    observation: str           # what the environment answers (a tool's output, a message); "" at the end
    reward: float              # the outcome reward, nonzero on the last step only in our tasks
    terminated: bool           # the episode ended on its own
    truncated: bool            # a cap ended it
    info: dict = field(default_factory=dict)  # {"stop": one of STOPS} on the last step, "tool": the call's name


@dataclass(frozen=True)
class Caps:
    """The caps of an episode: policy turns, tokens of the whole history (prompt, policy
    turns and observations together), and tokens of one policy turn."""
    max_turns: int = 8
    max_tokens: int = 2048
    turn_tokens: int = 256

    def validate(self) -> None:
        if min(self.max_turns, self.max_tokens, self.turn_tokens) < 1:
            raise ValueError(f"max_turns, max_tokens and turn_tokens must be >= 1, got "
                             f"{self.max_turns}, {self.max_tokens} and {self.turn_tokens}")


@dataclass
class Trace:
    """What an episode did, beyond its reward: the evidence record's agentic fields."""
    tools: list[str] = field(default_factory=list)   # tool names in call order ("invalid" for unparsed)
    failures: int = 0                                 # tool calls that failed (bad args, no match, error)
    files_read: list[str] = field(default_factory=list)
    files_edited: list[str] = field(default_factory=list)
    target_files: list[str] = field(default_factory=list)  # where the fix belongs (repositories)
    tests_run: int = 0
    git_access: int = 0                               # calls that reached for version-control history
    partial: float | None = None                      # a graded outcome logged beside the 0/1 reward


class Environment(ABC):
    caps: Caps = Caps()
    tools: Tools = {}

    def __init__(self) -> None:
        self.trace = Trace()

    @abstractmethod
    def reset(self, seed: int) -> str:
        """Start an episode; the first observation (the prompt)."""

    @abstractmethod
    def step(self, action: str) -> Step:
        """Play one policy turn (its text, end token excluded)."""

    def truncate(self, stop: str) -> Step:
        """A cap ended the episode (`stop` is TURN_CAP or TOKEN_CAP): the reward of the state
        as it stands (a repository is judged as the policy left it). Default: nothing earned."""
        return Step("", 0.0, False, True, {"stop": stop})

    def close(self) -> None:
        """Release what the episode holds (a workspace, a sandbox)."""


class SingleTurn(Environment):
    """A single-turn task as an environment: the prompt, one answer, the verifier's score."""

    caps = Caps(max_turns=1)

    def __init__(self, task: Task, problem: Problem):
        super().__init__()
        self.task, self.problem = task, problem

    def reset(self, seed: int) -> str:
        return self.problem.prompt

    def step(self, action: str) -> Step:
        score = self.task.score(self.problem, action)
        return Step("", score, True, False, {"stop": SUCCESS if score >= 1 else FAIL})


class EnvTask(Task):
    """A task whose problems are played, not answered: each problem opens an environment.

    Splits, streams and keys are a Task's (a problem is still the unit the held-out pool
    hashes); the verifier is the environment's final reward. Subclasses say how to open one
    (`environment`) and, for SFT of a base, how an expert plays it (`demonstration`)."""

    caps: Caps = Caps()
    action_format: str = "plain"  # the built-in parser the evaluator reads actions with (harness/actions.py)
    max_new_tokens = 0  # unused: a turn's budget is caps.turn_tokens, an episode's caps.max_tokens

    @abstractmethod
    def environment(self, problem: Problem, parse: Parser) -> Environment:
        """A fresh environment for `problem`, reading actions with `parse`."""

    def demonstration(self, problem: Problem) -> list[tuple[str, str]]:
        """An expert's episode: (policy turn text, observation after it) per turn, for SFT."""
        raise NotImplementedError(f"{self.name} has no demonstrations: bring a base model")

    def demonstrates(self) -> bool:
        """Whether the task has demonstrations, so a default base can be built for it."""
        return type(self).demonstration is not EnvTask.demonstration

    def sft_task(self) -> "EnvTask":
        """The task a base for this one is built on (a control that locks a tool: the open task)."""
        return self

    def score(self, problem: Problem, completion: str) -> float:
        raise TypeError(f"{self.name} is played in an environment, not scored from one completion")

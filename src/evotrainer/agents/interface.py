"""What a trainer agent is, as every agent (rules, random, llm, command) and the loop see it:
it is shown an `AgentContext` (the parent's findings, knobs and lineage) and returns one
`Proposal` (a single-variable change), `AgentFailed` (labelled, and the run goes on) or None
(nothing more to propose from this parent)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence, Union

from evotrainer.harness.knobs import Knobs
from evotrainer.skills import Skill


@dataclass(frozen=True)
class Proposal:
    intervention: str              # catalog name
    family: str                    # reward | group_filter | optimisation | exploration | efficiency | curriculum | signal
    hypothesis: str                # "changing X improves Y because Z"
    frozen: str                    # what stays as it is
    success_criterion: str
    rollback: str
    knobs: dict = field(default_factory=dict)   # knob -> new value (the one variable)
    files: dict = field(default_factory=dict)   # slot file -> its new source (a slot the knob names)
    agent: str = "rules"
    trigger: str = "none"                       # the finding it answers ("diagnostic:severity"), for skills
    expected: str = ""                          # the expected effect, where the agent states it apart
    usage: dict = field(default_factory=dict)   # what proposing cost (llm: calls, tokens, seconds)


@dataclass(frozen=True)
class AgentFailed:
    """An agent that could not produce a usable proposal: the trial is recorded with `label`
    (unparseable, patch_failed, syntax_error, agent_timeout, agent_error) and the run goes on."""
    label: str
    reason: str
    agent: str
    intervention: str = "agent_failed"
    hypothesis: str = "-"
    usage: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Escalation:
    """What three failures in a row change (EvoTrainer): leave the layers that failed, prefer
    subtracting a change over adding one, ignore findings from diagnostics whose replay did
    not separate failed versions from those that held up. The controller also rolls the
    parent back to the last kept version."""
    avoid: frozenset[str] = frozenset()     # intervention families of the failures
    ignore: frozenset[str] = frozenset()    # diagnostics judged not to measure what they claim
    subtract: bool = True


@dataclass(frozen=True)
class AgentContext:
    """Everything a trainer agent is shown about the parent it improves."""
    findings: Sequence[Mapping]             # the parent's health-report findings, worst first
    knobs: Knobs                            # the parent's knobs
    root_knobs: Knobs                       # the root harness's knobs (what subtracting returns to)
    target_level: int
    task: str = ""                          # the task's name as the skill library records it ("arith", "rg:chain_sum")
    tried: frozenset[str] = frozenset()     # interventions already tried from this parent
    skills: Sequence[Skill] = ()            # the skill library's entries (ranked by the findings)
    escalation: Escalation | None = None
    seed: int = 0                           # for agents that draw at random
    # what agents that read and write code are shown besides (llm, command)
    parent: str = "v0"                      # the parent's version
    harness_dir: Path | None = None         # the parent's harness files (read only)
    lineage: str = ""                       # leaderboard, path to the best, the best's children
    feedback: str = ""                      # a person's words from a gate (`evotrainer revise`)
    trial: int = 0
    workdir: Path | None = None             # where the agent may keep its transcript and worktree
    # an evolving search controller's weights per intervention family (evolve/search/policy.py;
    # none: every family alike, the fixed order)
    family_weights: Mapping[str, float] = field(default_factory=dict)
    # trials per intervention family so far in this run (search.order: spread; none: the
    # findings' order): among families of equal weight, the least tried lead
    family_trials: Mapping[str, int] | None = None
    # families another trial in flight is changing from the same parent (search.concurrency > 1):
    # a proposal from here leaves them to that trial's specialist (evolve/search/specialists.py)
    closed: frozenset[str] = frozenset()
    # the rest of the conditions the skill library weighs its evidence by (skills.Conditions)
    reference_acc: float | None = None      # the root's validation accuracy (the reference recipe's)
    backend: str | None = None


Agent = Callable[[AgentContext], Union[Proposal, AgentFailed, None]]

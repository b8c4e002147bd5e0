"""A trial's plan as the lineage records it: what it sets out to do, written before any of it runs.

The plan is recorded as the trial's `trial_started` event (lineage/events.py), so a
controller killed mid-trial redoes the trial under its number with the same plan, and the
search reads back where every trial came from (its parent state, a crossover's mate, the
finding that prompted it, the surface it touched).

`to_json` writes the dict the controller has always written, key for key, and `from_json`
reads it back, older records included. Plans of different origins state different things:
an agent's failure patches nothing, a crossover has no round and cost no agent; a field a
plan does not state is None here and absent from its JSON, so a record reads back exactly
as it was written.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping

from evotrainer.labels import Label
from evotrainer.lineage.state import State


@dataclass(frozen=True)
class Failure:
    """Why a plan can never run: the agent produced nothing usable, or a person's revision
    left the agent nothing else to propose. The trial is recorded with this label, untrained."""
    label: str                  # a Label: an agent failure's, or aborted
    reason: str


@dataclass(frozen=True)
class TrialPlan:
    parent: State                        # the state the child trains on from
    version: str | None                  # the version it commits ("v7", a revision "v7r1"); None: nothing to commit
    round: int | None                    # 0, or the revision a person asked for at an approval point; None: a crossover
    intervention: str                    # catalog name, or an agent's own name for its change
    family: str                          # the harness surface it touches (a specialist's role for llm agents)
    hypothesis: str                      # "changing X improves Y because Z"
    frozen: str | None                   # what stays as it is
    success_criterion: str
    rollback: str | None
    knobs: dict | None                   # knob -> new value
    files: dict | None                   # slot file -> its new source
    agent: str                           # who proposed it: rules, random, llm, command, crossover
    trigger: str | None                  # the finding it answers ("diagnostic:severity", or "none"), for skills
    expected: str | None                 # the expected effect, where the agent states it apart
    usage: dict | None                   # what proposing cost, every round together (llm: calls, tokens, seconds)
    mate: State | None = None            # a crossover's second parent
    failed: Failure | None = None        # never runs: recorded with this label
    rejected: tuple[str, ...] | None = None   # interventions a person turned down at an approval point, this trial
    feedback: str | None = None          # that person's words
    beside: tuple[int, ...] | None = None  # trials in flight when it was proposed (search.concurrency > 1)
    saw: tuple[int, ...] | None = None   # the finished trials its proposal read (search.concurrency > 1)
    merged: tuple[int, ...] | None = None  # a near-miss merge's: the discarded trials whose changes it combines

    @property
    def parents(self) -> list[str]:
        return [self.parent.version] + ([self.mate.version] if self.mate else [])

    # ------------------------------------------------------------------ JSON (the lineage's trial_started)

    def to_json(self) -> dict:
        always = {"parent_state": dataclasses.asdict(self.parent), "version": self.version,
                  "intervention": self.intervention, "family": self.family, "hypothesis": self.hypothesis,
                  "success_criterion": self.success_criterion, "agent": self.agent}
        stated = {"round": self.round, "frozen": self.frozen, "rollback": self.rollback, "knobs": self.knobs,
                  "files": self.files, "trigger": self.trigger, "expected": self.expected, "usage": self.usage,
                  "mate_state": self.mate and dataclasses.asdict(self.mate),
                  "failed": self.failed and dataclasses.asdict(self.failed),
                  "rejected": None if self.rejected is None else list(self.rejected), "feedback": self.feedback,
                  "beside": None if self.beside is None else list(self.beside),
                  "saw": None if self.saw is None else list(self.saw),
                  "merged": None if self.merged is None else list(self.merged)}
        return always | {k: v for k, v in stated.items() if v is not None}

    @classmethod
    def from_json(cls, d: dict) -> "TrialPlan":
        """A recorded plan (extra keys, such as an event's own, are passed over)."""
        return cls(parent=State.of(d["parent_state"]), version=d["version"], round=d.get("round"),
                   intervention=d["intervention"], family=d["family"], hypothesis=d["hypothesis"],
                   frozen=d.get("frozen"), success_criterion=d["success_criterion"], rollback=d.get("rollback"),
                   knobs=d.get("knobs"), files=d.get("files"), agent=d["agent"], trigger=d.get("trigger"),
                   expected=d.get("expected"), usage=d.get("usage"),
                   mate=State.of(d["mate_state"]) if d.get("mate_state") else None,
                   failed=Failure(**d["failed"]) if d.get("failed") else None,
                   rejected=None if d.get("rejected") is None else tuple(d["rejected"]), feedback=d.get("feedback"),
                   beside=None if d.get("beside") is None else tuple(d["beside"]),
                   saw=None if d.get("saw") is None else tuple(d["saw"]),
                   merged=None if d.get("merged") is None else tuple(d["merged"]))

    # ------------------------------------------------------------------ revising at an approval point

    def revision(self, proposed: "TrialPlan | None", feedback: str) -> "TrialPlan":
        """The plan after a person asked at an approval point for another proposal: `proposed`, the agent's
        next (asked with `rejected_so_far` counted as tried), or this plan withdrawn (labelled
        aborted) where the agent had nothing else. Either carries the interventions turned down
        and the person's words; proposing costs add up over the rounds, so the trial's budgets
        hold the whole bill."""
        new = proposed or dataclasses.replace(self, round=self.next_round, usage={}, failed=Failure(
            Label.ABORTED, f"revised at an approval point, and the agent has nothing else to propose from {self.parent.version}"))
        return dataclasses.replace(new, rejected=self.rejected_so_far, feedback=feedback,
                                   usage=add_usage(self.usage, new.usage))

    @property
    def next_round(self) -> int:
        return (self.round or 0) + 1

    @property
    def rejected_so_far(self) -> tuple[str, ...]:
        """The interventions turned down at an approval point this trial, this one included (the agent counts them tried)."""
        return tuple(dict.fromkeys([*(self.rejected or ()), self.intervention]))


def add_usage(before: Mapping | None, after: Mapping | None) -> dict:
    """Two rounds' proposing costs as one: counts and seconds add up, the rest is the later's."""
    before, after = dict(before or {}), dict(after or {})
    out = before | after
    for k, v in after.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and isinstance(before.get(k), (int, float)):
            out[k] = round(before[k] + v, 3) if isinstance(v, float) else before[k] + v
    return out

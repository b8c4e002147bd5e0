"""The lineage's events: one frozen dataclass per kind the controller records.

An event is stored as a row (kind, trial, JSON data): `kind` is the class's KIND, `trial`
(for the kinds that belong to one trial) has a column of its own, and `to_json` gives the
data, key for key what the controller wrote before events were typed, so old and new runs
look alike. `from_json` reads a row back: a key the class does not know (a newer writer's,
or one a kind once carried) is passed over, and a field an older run did not record takes
the default written beside it. A kind no class knows reads back as `Unknown`.
"""
from __future__ import annotations

import uuid
from dataclasses import MISSING, dataclass, field, fields
from typing import Callable, ClassVar, Mapping, TypeVar

from evotrainer.errors import UsageError
from evotrainer.lineage.plan import TrialPlan
from evotrainer.lineage.state import State

E = TypeVar("E", bound="Event")
KINDS: dict[str, type["Event"]] = {}  # kind -> its class (filled by `stored_as`)


def stored_as(name: str, was: tuple[str, ...] = ()):
    """Register an event class under the kind its rows carry; `was`: the kinds older runs
    stored it under, read as it (never written)."""
    def register(cls: type[E]) -> type[E]:
        cls.KIND, cls.STORED = name, (name, *was)
        for n in cls.STORED:
            KINDS[n] = cls
        return cls
    return register


@dataclass(frozen=True)
class Event:
    KIND: ClassVar[str] = ""
    STORED: ClassVar[tuple[str, ...]] = ()   # KIND, and the kinds older runs stored the class under
    READ: ClassVar[dict[str, Callable]] = {}  # field -> how its JSON value is read (a nested record)

    @property
    def trial_column(self) -> int | None:
        """The row's trial column: the trial the event belongs to, where it belongs to one."""
        return getattr(self, "trial", None)

    def to_json(self) -> dict:
        """The row's data (the trial, if any, is stored in its own column)."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self) if f.name != "trial"}

    @classmethod
    def from_json(cls: type[E], data: Mapping, trial: int | None = None) -> E:
        known = {f.name: f for f in fields(cls)}
        kw = {k: cls.READ.get(k, _same)(v) for k, v in data.items() if k in known and k != "trial"}
        if "trial" in known:
            kw["trial"] = trial
        lacking = [n for n, f in known.items() if n not in kw and f.default is MISSING
                   and f.default_factory is MISSING]
        if lacking:
            raise UsageError(f"a '{cls.KIND}' event in the lineage lacks {', '.join(lacking)}: not a run this "
                             f"evotrainer can read")
        return cls(**kw)


def _plain(x):
    return x.to_json() if hasattr(x, "to_json") else x


def _same(x):
    return x


def decode(name: str, data: Mapping, trial: int | None = None) -> "Event":
    """A stored row as its event; a row its class cannot read is a UsageError (one line)."""
    cls = KINDS.get(name)
    if cls is None:
        return Unknown(name, dict(data), trial)
    try:
        return cls.from_json(data, trial)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise UsageError(f"a '{name}' event in the lineage is malformed ({type(e).__name__}: {e}): not a run "
                         f"this evotrainer can read") from None


@dataclass(frozen=True)
class Unknown(Event):
    """A row of a kind this code does not write (an older or newer controller's), kept as it is."""
    kind: str
    data: dict
    trial: int | None = None

    def to_json(self) -> dict:
        return dict(self.data)


# ---------------------------------------------------------------------- the run

@stored_as("session_started")
@dataclass(frozen=True)
class SessionStarted(Event):
    """A controller process began (a run, or a resume): status adds up the time between sessions."""
    sandbox: dict | None = None          # sandbox.record: the isolation level (runs before it: none)


@stored_as("run_started")
@dataclass(frozen=True)
class RunStarted(Event):
    """The run's base and its set-up, recorded once: a resume reads them back."""
    base: str                            # the base checkpoint every version trains from
    max_depth: int
    base_s: float = 0.0                  # seconds building the base (runs before it: not counted)
    task: str | None = None              # the task's canonical spec (older runs: not recorded)
    runtime: dict | None = None          # Runtime.to_dict (older runs: not recorded)
    split_key: str | None = None         # whose split key (runs before split keys: None, the public split)
    split_key_digest: str | None = None
    device: str | None = None            # as resolved (cuda, bfloat16)
    executor: str = "local"              # local pool or Ray (runs before it: local)
    run_id: str | None = None            # new_run_id() (runs before it: None, known by their directory)

    def to_json(self) -> dict:
        out = super().to_json()
        if self.run_id is None:  # a run from before run ids: its row, written back, is what it was
            del out["run_id"]
        return out


def new_run_id() -> str:
    """A run's id: a run made again in a deleted run's directory is another run (its skill
    outcomes are its own)."""
    return uuid.uuid4().hex


@stored_as("run_finished")
@dataclass(frozen=True)
class RunFinished(Event):
    trials: int                          # trials recorded when the budget was spent


@stored_as("stopped")
@dataclass(frozen=True)
class Stopped(Event):
    reason: str                          # why the search ended before its budget


@stored_as("tracker_failed")
@dataclass(frozen=True)
class TrackerFailed(Event):
    tracker: str
    error: str


# ---------------------------------------------------------------------- trials

@stored_as("trial_started")
@dataclass(frozen=True)
class TrialStarted(Event):
    """A trial began: its plan, so a resume redoes it (its latest start, after a revision).
    The root's start plans nothing: it names its intervention ("root") and version only."""
    trial: int
    intervention: str | None = None
    version: str | None = None
    plan: TrialPlan | None = None

    @classmethod
    def of(cls, trial: int, plan: TrialPlan) -> "TrialStarted":
        return cls(trial, plan.intervention, plan.version, plan)

    def to_json(self) -> dict:
        return self.plan.to_json() if self.plan else {"intervention": self.intervention, "version": self.version}

    @classmethod
    def from_json(cls, data: Mapping, trial: int | None = None) -> "TrialStarted":
        plan = TrialPlan.from_json(dict(data)) if "parent_state" in data else None
        return cls(trial, data.get("intervention"), data.get("version"), plan)


@stored_as("trial_finished")
@dataclass(frozen=True)
class TrialFinished(Event):
    """Written with the trial's row, in its transaction (LineageStore.finish_trial)."""
    trial: int
    label: str
    version: str | None


@stored_as("trial_resumed")
@dataclass(frozen=True)
class TrialResumed(Event):
    trial: int
    intervention: str | None = None


@stored_as("parent_exhausted")
@dataclass(frozen=True)
class ParentExhausted(Event):
    """The agent had nothing (more) to propose from this state: it is never a parent again."""
    version: str
    depth: int


@stored_as("control_finished")
@dataclass(frozen=True)
class ControlFinished(Event):
    """A parent continued one segment with its own harness: every child of it at that depth
    is judged against this state, and it may be a parent itself."""
    READ = {"state": State.of}
    state: State


@stored_as("pair_control_finished")
@dataclass(frozen=True)
class PairControlFinished(Event):
    """The control's arm of the sequential gate's extra seed pair `pair` (shared by siblings)."""
    version: str
    depth: int
    pair: int
    val: float


@stored_as("escalated")
@dataclass(frozen=True)
class Escalated(Event):
    """Three failures in a row, decided once per streak (`after`: its last trial)."""
    after: int
    avoid: list[str]                     # intervention families to leave
    ignore: list[str]                    # diagnostics whose findings mislead


@stored_as("crossover_conflict")
@dataclass(frozen=True)
class CrossoverConflict(Event):
    parents: list[str]
    conflicts: list[str]


@stored_as("controller_revised")
@dataclass(frozen=True)
class ControllerRevised(Event):
    """The search controller's policy revised (search.controller: evolving), decided once after
    trial `after` and read back by a resume. `policy` is the whole new policy as plain data
    (evolve/search/policy.py reads it); `changes` says what moved, `reason` why, in words, and
    `cites` the trials whose outcomes are the evidence."""
    revision: int                        # 1, 2, ...: revision 0 is the run's starting policy
    after: int                           # the last finished trial it read
    policy: dict
    changes: list[str]                   # "frontier 4 -> 5", "weight reward 1 -> 1.5"
    reason: str
    cites: list[int]


@stored_as("replay_failed")
@dataclass(frozen=True)
class DiagnosticReplayFailed(Event):
    """A diagnostic's replay could not run while deciding an escalation: it stays trusted."""
    diagnostic: str
    error: str


# ---------------------------------------------------------------------- a person's approval

@stored_as("approval_waiting", was=("gate_waiting",))
@dataclass(frozen=True)
class ApprovalWaiting(Event):
    """A trial paused at an approval point for a person's decision. `shown` is what the point shows
    besides the proposal (the patch, the backtest, the gate's verdict), stored beside it."""
    trial: int
    point: str                           # design | backtest | completion
    round: int
    intervention: str
    hypothesis: str
    shown: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"point": self.point, "round": self.round, "intervention": self.intervention,
                "hypothesis": self.hypothesis} | self.shown

    @classmethod
    def from_json(cls, data: Mapping, trial: int | None = None) -> "ApprovalWaiting":
        own = {"point", "round", "intervention", "hypothesis"}
        return cls(trial, data["point"], data["round"], data["intervention"], data["hypothesis"],
                   {k: v for k, v in data.items() if k not in own})

    @property
    def key(self) -> tuple[int, str, int]:
        return (self.trial, self.point, self.round)


@stored_as("approval_decided", was=("gate_decided",))
@dataclass(frozen=True)
class ApprovalDecided(Event):
    trial: int
    point: str
    round: int
    decision: str                        # approve | revise | abort
    feedback: str = ""

    @property
    def key(self) -> tuple[int, str, int]:
        return (self.trial, self.point, self.round)


# ---------------------------------------------------------------------- the final comparison

@stored_as("final_started")
@dataclass(frozen=True)
class FinalStarted(Event):
    winner: str                          # "vN@D"
    schedule: list[str]                  # its harness versions, depth by depth
    seeds: list[int]


@stored_as("final_finished")
@dataclass(frozen=True)
class FinalFinished(Event):
    """The final comparison, as final.json holds it (evolve/stats/final.py makes `comparison` and `table`)."""
    winner: str
    schedule: list[str]
    seeds: list[int]
    total_steps: int
    base: dict                           # the base's own scores
    comparison: dict                     # split -> reference, evolved, difference (mean, ci, level, interval)
    budgets: dict                        # train_s, eval_s of the retraining
    table: str

    def difference(self, split: str) -> dict:
        """The evolved - reference difference on `split`, as status shows it (a run recorded
        before t intervals had a bootstrap interval, and no name for it)."""
        d = self.comparison[split]["difference"]
        return {"mean": d["mean"], "ci": d["ci"], "level": d["level"], "interval": d.get("interval", "bootstrap")}

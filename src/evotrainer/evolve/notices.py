"""What a run shows while it works, as `Controller(on_event=...)` receives it: one typed
object per notice, never a (kind, dict) pair.

A notice is one of:
- a lineage event (lineage/events.py) as it is recorded: `RunStarted`, `ApprovalWaiting`,
  `FinalFinished`, ...; also `TrialStarted` as a trial begins;
- a finished trial's `TrialRecord`, with its typed fitness;
- `Progress` (evolve/segments/progress.py): training steps of the jobs in flight;
- `SftProgress` (trainer/pretrain.py): a probe check while the base builds;
- `Stage` and `BasePlan` below: shown and never stored (the lineage records outcomes).

A printer dispatches on the type (`isinstance`), so a new notice is a new class, not a new
string to match.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Union

if TYPE_CHECKING:
    from evotrainer.evolve.segments.progress import Progress
    from evotrainer.lineage import TrialRecord
    from evotrainer.lineage.events import Event
    from evotrainer.trainer.pretrain import SftProgress


@dataclass(frozen=True)
class Stage:
    """What the run does now: "trial 1 v1 [partial_credit]: trains v1 beside its control"."""
    text: str


@dataclass(frozen=True)
class BasePlan:
    """The SFT stages the base still needs, announced before they train (cached afterwards)."""
    text: str


Notice = Union["Event", "TrialRecord", "Progress", "SftProgress", Stage, BasePlan]
OnEvent = Callable[[Notice], None]


def ignore(notice: Notice) -> None:
    """The default listener: a run without a display shows nothing."""

"""What a trial is given of the run: the controller builds one per trial (evolve/trial.py uses
nothing else), so a trial never reaches into the controller and the two modules do not import
each other.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from evotrainer.config import RunConfig
from evotrainer.evolve.notices import OnEvent
from evotrainer.evolve.search.view import RunView
from evotrainer.evolve.segments.state import State
from evotrainer.evolve.segments.training import Training
from evotrainer.harness.candidate import Candidate
from evotrainer.harness.versions import HarnessRepo
from evotrainer.lineage import TrialRecord
from evotrainer.lineage.events import ApprovalDecided, ApprovalWaiting, Event


@dataclass(frozen=True)
class TrialTools:
    cfg: RunConfig
    run_dir: Path
    view: RunView                        # the lineage as it stood when the trial began
    repo: HarnessRepo                    # the run's harness versions (diffs, files changed)
    training: Training                   # trains and scores segments
    run_backtests: bool                  # False: the gate alone judges (a test's setting)
    harness_dir: Callable[[str], Path]   # a version's harness, checked out
    candidate: Callable[[str, str, dict, dict, str], Candidate]  # parent, version, knobs, files, hypothesis
    findings: Callable[[State], list[dict]]           # a state's worst findings (read once per state)
    read_later: Callable[[str, dict[int, str]], None]  # start reading a state's findings in a thread
    record: Callable[[Event], None]      # an event into the lineage, and shown
    ask: Callable[[ApprovalWaiting], ApprovalDecided]          # a person's decision at an approval point (approval.ask)
    finish: Callable[[TrialRecord, State | None], None]  # the trial's record, and the state it keeps
    stage: Callable[[str], None]         # what the run does now (shown, never stored)
    show: OnEvent                        # a notice shown live and not stored
    # make(), once per key however many trials in flight ask (a control two trials need)
    once: Callable[[tuple, Callable[[], object]], object] = lambda key, make: make()

    @property
    def restart(self) -> bool:
        return self.cfg.search.restarts

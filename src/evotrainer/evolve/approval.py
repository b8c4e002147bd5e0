"""A person's approval: the run pauses at a chosen point of a trial until a person decides.

Points: `design` (the proposal's legal diff, before the backtest), `backtest` (before any
training), `completion` (the trained child and the promotion gate's verdict, before it is
recorded). The controller records `approval_waiting` and polls for a decision file; `evotrainer
approve | revise | abort RUN TRIAL` writes that file (aside, then linked into place, so it is
read whole and of two decisions sent at once only one lands), and the controller records
`approval_decided` before it deletes the file: the lineage keeps one writer, and a run killed
at any moment that resumes finds its recorded decisions and does not ask again.

    approve   go on as proposed (or as the promotion gate decided)
    revise    withdraw the proposal; the agent proposes again for the same trial, told the
              person's feedback (the rules agent takes its next idea)
    abort     end the trial now, labelled `aborted`; the run goes on with the next
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Sequence

from evotrainer.config import ApprovalConfig
from evotrainer.errors import UsageError
from evotrainer.lineage import LineageStore
from evotrainer.lineage.events import Event, ApprovalDecided, ApprovalWaiting
from evotrainer.evolve.notices import OnEvent

DECISIONS = ("approve", "revise", "abort")


class Revise(Exception):
    """A person asked at an approval point for another proposal, with this feedback."""

    def __init__(self, feedback: str):
        self.feedback = feedback
        super().__init__(feedback)


def points(approval: ApprovalConfig, failures_in_a_row: int) -> set[str]:
    """Where a trial pauses: the configured points, plus design after `after_failures` failures
    in a row (a person looks before more budget goes; 0 never)."""
    n = approval.after_failures
    return set(approval.at) | ({"design"} if n and failures_in_a_row >= n else set())


def decision_file(run_dir: Path, trial: int) -> Path:
    return Path(run_dir) / "approval" / f"trial-{trial}.json"


def waiting(events: Sequence[Event]) -> list[ApprovalWaiting]:
    """`approval_waiting` events not yet decided, oldest first (normally one)."""
    decided = {e.key for e in events if isinstance(e, ApprovalDecided)}
    return [e for e in events if isinstance(e, ApprovalWaiting) and e.key not in decided]


def submit(run_dir: Path, events: Sequence[Event], trial: int, decision: str, feedback: str = "") -> dict:
    """The CLI's side: a decision for the approval point trial `trial` waits at, or a clear refusal."""
    if decision not in DECISIONS:
        raise UsageError(f"unknown decision '{decision}'; valid choices: {', '.join(DECISIONS)}")
    if decision == "revise" and not feedback.strip():
        raise UsageError("revise needs --feedback TEXT: what the agent should change")
    open_ = waiting(events)
    asked = next((e for e in open_ if e.trial == trial), None)
    if asked is None:
        now = ", ".join(f"trial {e.trial} at {e.point}" for e in open_) or "none"
        raise UsageError(f"trial {trial} is not waiting at an approval point; waiting now: {now}")
    f = decision_file(run_dir, trial)
    out = {"trial": trial, "point": asked.point, "round": asked.round, "decision": decision,
           "feedback": feedback.strip()}
    tmp = f.with_name(f"{f.stem}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(out))
    try:  # exclusive: of two decisions sent at once, one lands and the other is refused
        os.link(tmp, f)
    except FileExistsError:
        raise UsageError(f"trial {trial} already has a decision the run has not read yet ({f})") from None
    finally:
        tmp.unlink()
    return out


def ask(store: LineageStore, run_dir: Path, asked: ApprovalWaiting, on_event: OnEvent,
        poll_s: float) -> ApprovalDecided:
    """The controller's side: the decision for this approval point, recorded in the lineage. One recorded
    before a kill is reused; else `approval_waiting` is recorded (once) and the run waits. (The
    store is read here, not from the trial's view of the run: the approval's own events land
    while the trial runs.)"""
    f = decision_file(run_dir, asked.trial)
    done = [e for e in store.events(ApprovalDecided) if e.key == asked.key]
    if done:  # decided before a kill: the file may still be there, and is spent
        f.unlink(missing_ok=True)
        return done[-1]
    if not any(e.key == asked.key for e in store.events(ApprovalWaiting)):
        f.parent.mkdir(exist_ok=True)
        store.append(asked)
    on_event(asked)
    d = ApprovalDecided(asked.trial, asked.point, asked.round, **wait_for(run_dir, asked.trial, asked.point,
                                                                      asked.round, poll_s))
    store.append(d)
    f.unlink()  # recorded first: a kill in between finds the decision in the lineage
    on_event(d)
    return d


def wait_for(run_dir: Path, trial: int, point: str, round_: int, poll_s: float = 1.0) -> dict:
    """Block until the decision file for this approval point arrives (the caller deletes it once recorded).
    A file for another approval point (stale, or malformed) is set aside (renamed), never acted on."""
    f = decision_file(run_dir, trial)
    while True:
        if f.exists():
            try:
                d = json.loads(f.read_text())
            except ValueError:
                d = None
            if isinstance(d, dict) and d.get("point") == point and d.get("round") == round_ \
                    and d.get("decision") in DECISIONS:
                return {"decision": d["decision"], "feedback": d.get("feedback", "")}
            f.rename(f.with_suffix(f".rejected-{int(time.time())}"))
        time.sleep(poll_s)

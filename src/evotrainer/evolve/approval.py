"""Human gates: the run pauses at a chosen point of a trial until a person decides.

Points: `design` (the proposal, before legality and backtest), `backtest` (before any
training), `completion` (the trained child and the promotion gate's verdict, before it is
recorded). The controller records `gate_waiting` and polls for a decision file; `evotrainer
approve | revise | abort RUN TRIAL` writes that file (aside, then renamed, so it is read
whole), and the controller records `gate_decided`: the lineage keeps one writer. A killed
run that resumes finds its recorded decisions and does not ask again.

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

from evotrainer.errors import UsageError

DECISIONS = ("approve", "revise", "abort")


def decision_file(run_dir: Path, trial: int) -> Path:
    return Path(run_dir) / "gates" / f"trial-{trial}.json"


def waiting(events: list[dict]) -> list[dict]:
    """`gate_waiting` events not yet decided, oldest first (normally one)."""
    decided = {(e["trial"], e["point"], e["round"]) for e in events if e["kind"] == "gate_decided"}
    return [e for e in events if e["kind"] == "gate_waiting" and (e["trial"], e["point"], e["round"]) not in decided]


def submit(run_dir: Path, events: list[dict], trial: int, decision: str, feedback: str = "") -> dict:
    """The CLI's side: a decision for the gate trial `trial` is waiting at, or a clear refusal."""
    if decision not in DECISIONS:
        raise UsageError(f"unknown decision '{decision}'; valid choices: {', '.join(DECISIONS)}")
    if decision == "revise" and not feedback.strip():
        raise UsageError("revise needs --feedback TEXT: what the agent should change")
    open_ = waiting(events)
    gate = next((e for e in open_ if e["trial"] == trial), None)
    if gate is None:
        now = ", ".join(f"trial {e['trial']} at {e['point']}" for e in open_) or "none"
        raise UsageError(f"trial {trial} is not waiting at a gate; waiting now: {now}")
    f = decision_file(run_dir, trial)
    if f.exists():
        raise UsageError(f"trial {trial} already has a decision the run has not read yet ({f})")
    out = {"trial": trial, "point": gate["point"], "round": gate["round"], "decision": decision,
           "feedback": feedback.strip()}
    tmp = f.with_suffix(".tmp")
    tmp.write_text(json.dumps(out))
    os.replace(tmp, f)
    return out


def wait_for(run_dir: Path, trial: int, point: str, round_: int, poll_s: float = 1.0) -> dict:
    """The controller's side: block until the decision for this gate arrives; consume it. A file
    for another gate (stale, or malformed) is set aside with its reason, never acted on."""
    f = decision_file(run_dir, trial)
    while True:
        if f.exists():
            try:
                d = json.loads(f.read_text())
            except ValueError:
                d = None
            if isinstance(d, dict) and d.get("point") == point and d.get("round") == round_ \
                    and d.get("decision") in DECISIONS:
                f.unlink()
                return {"decision": d["decision"], "feedback": d.get("feedback", "")}
            f.rename(f.with_suffix(f".rejected-{int(time.time())}"))
        time.sleep(poll_s)

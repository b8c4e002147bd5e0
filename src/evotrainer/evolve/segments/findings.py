"""What the controller reads off a state's evidence, and whether a diagnostic earns its keep.

A state's findings come from its own harness's diagnostics (a diagnostic its harness adds
is read on it at once). A new or revised diagnostic is replayed over the evidence of every
version this run trained and judged, and kept only if it separates the versions that fell
short from those that held up (EvoTrainer); escalation asks the same of the diagnostics
that prompted a streak of failures, and ignores one that ranks them backwards.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from evotrainer.diagnostics.health import diagnose
from evotrainer.diagnostics.replay import replay
from evotrainer.diagnostics.spec import SEVERITIES
from evotrainer.errors import HarnessFailed, UsageError
from evotrainer.jobfiles import shown
from evotrainer.labels import REPLAYABLE
from evotrainer.lineage import TrialRecord
from evotrainer.lineage.events import DiagnosticReplayFailed, Event


def worst_findings(dirs: Sequence[str], harness_dir: Path) -> list[dict]:
    """The worst finding per diagnostic over a state's train directories, critical and
    blocking first, as the state's own harness (`harness_dir`) reads them."""
    reports = []
    for d in dirs:
        try:
            reports.append(report_findings(diagnose(d, harness_dir)))
        except HarnessFailed as e:  # its diagnostics.py fails: blocking, so it is never promoted
            reports.append([_failed(f"{e.label}: {e.detail}")])
        except ValueError as e:  # what a harness's diagnostics worker returned is malformed (BadOutput
            reports.append([_failed(f"its findings do not read: {shown(e)}")])  # too: the evidence it read)
    return worst_of(reports)


def worst_of(reports: Sequence[Sequence[dict]]) -> list[dict]:
    """One finding per diagnostic over several seeds' reports, the most severe; critical and
    blocking ones first."""
    worst: dict[str, dict] = {}
    for report in reports:
        for f in report:
            kept = worst.get(f["diagnostic"])
            if kept is None or SEVERITIES.index(f["severity"]) > SEVERITIES.index(kept["severity"]):
                worst[f["diagnostic"]] = f
    return sorted(worst.values(), key=lambda f: (f["severity"] != "critical", not f["blocking"]))


FINDING = {"diagnostic": str, "layer": str, "severity": str, "blocking": bool, "value": (int, float),
           "evidence": str, "suggest": str}


def report_findings(reports: object) -> list[dict]:
    """The findings of the one health report `diagnose` returned, each checked (ValueError if not)."""
    try:
        found = reports[0]["findings"]
    except (IndexError, KeyError, TypeError):
        raise ValueError("the health report holds no findings") from None
    if not isinstance(found, list):
        raise ValueError("the health report's findings are not a list")
    return [checked_finding(f) for f in found]


def checked_finding(f: object) -> dict:
    """A finding as the controller reads it: a harness's diagnostics worker returned it, so its
    fields and severity are checked (ValueError if wrong), never trusted."""
    if not isinstance(f, dict):
        raise ValueError("a finding is not an object")
    for k, kind in FINDING.items():
        if not isinstance(f.get(k), kind):
            raise ValueError(f"a finding's {k} is {type(f.get(k)).__name__}")
    if f["severity"] not in SEVERITIES:
        raise ValueError(f"severity {shown(f['severity'])[:40]}; valid choices: {', '.join(SEVERITIES)}")
    return f


def _failed(why: str) -> dict:
    """The finding that stands for diagnostics that failed: critical and blocking, so a version
    whose diagnostics cannot be read is never promoted."""
    return {"diagnostic": "diagnostics_failed", "layer": "custom", "severity": "critical", "blocking": True,
            "value": 1.0, "thresholds": "none", "evidence": why[:500],
            "suggest": "diagnostics: fix or revert diagnostics.py"}


@dataclass(frozen=True)
class Replayed:
    """A new or revised diagnostic replayed over the run's judged versions (stored with the trial)."""
    diagnostic: str
    auc: float | None           # None: too few of either kind to tell, or it did not run
    kept: bool                  # it separates failed from held-up versions
    versions: int               # trials whose evidence it was replayed over
    error: str | None = None    # why it could not load or run

    def to_json(self) -> dict:
        out = {"diagnostic": self.diagnostic, "auc": self.auc, "kept": self.kept, "versions": self.versions}
        return out if self.error is None else out | {"error": self.error}

    @property
    def why_not(self) -> str:
        """Why it was not kept, in words."""
        if self.error:
            return self.error
        if self.auc is None:
            return (f"undecidable over {self.versions} versions: a diagnostic is kept only once the run has both a "
                    "failed version and one that held up to separate")
        return f"AUC {self.auc} over {self.versions} versions does not separate failed from held-up ones (needs 0.8)"


def replay_revised(names: Sequence[str], trials: Sequence[TrialRecord], harness_dir: Path,
                   timeout_s: float) -> list[Replayed]:
    """Each diagnostic of `names` from the harness at `harness_dir`, replayed (in a worker)
    over the evidence of every version this run trained and judged, the root included."""
    labelled, versions = {}, set()
    for t in trials:
        if t.label in REPLAYABLE:
            for d in t.fitness.dirs.values():
                if d not in labelled:  # a version kept without training shares its parent's
                    labelled[d] = t.label
                    versions.add(t.id)
    out = []
    for name in names:
        try:
            r = replay(name, [(Path(d), lab) for d, lab in labelled.items()], harness_dir=harness_dir,
                       timeout_s=timeout_s)
            out.append(Replayed(name, r.auc, r.kept, len(versions)))
        except (UsageError, HarnessFailed) as e:  # it does not load or run: not kept
            out.append(Replayed(name, None, False, len(versions), str(e)))
    return out


def misleads(trials: Sequence[TrialRecord], name: str, timeout_s: float,
             record: Callable[[Event], None]) -> bool:
    """Whether diagnostic `name` ranks this run's failed versions *better* than its kept ones
    (replay AUC < 0.5); undecidable (too few of either) counts as not misleading, and so does
    a replay that cannot run (`record`ed as DiagnosticReplayFailed)."""
    labelled = [(Path(d), t.label) for t in trials if t.parents and t.label in REPLAYABLE
                for d in t.fitness.dirs.values()]
    try:
        r = replay(name, labelled, timeout_s=timeout_s)
    except Exception as e:  # a replay that cannot run leaves the diagnostic trusted
        record(DiagnosticReplayFailed(name, str(e)))
        return False
    return r.auc is not None and r.auc < 0.5

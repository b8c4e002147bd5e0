"""The lineage: SQLite events and trials, one writer (the controller), resumable."""
from evotrainer.lineage.store import LABELS, LineageStore, TrialRecord

__all__ = ["LABELS", "LineageStore", "TrialRecord"]

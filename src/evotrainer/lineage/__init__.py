"""The lineage: SQLite events and trials, one writer (the controller), resumable."""
from evotrainer.lineage.store import LineageStore, TrialRecord

__all__ = ["LineageStore", "TrialRecord"]

"""The lineage: SQLite events and trials, one writer (the controller), resumable."""
from evotrainer.lineage.store import SCHEMA_VERSION, LineageStore, Logged, TrialRecord

__all__ = ["SCHEMA_VERSION", "LineageStore", "Logged", "TrialRecord"]

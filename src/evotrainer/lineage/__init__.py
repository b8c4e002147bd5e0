"""The lineage: SQLite events and trials, one writer (the controller), resumable."""
from evotrainer.lineage.fitness import Decision, Fitness
from evotrainer.lineage.store import SCHEMA_VERSION, LineageStore, Logged, TrialRecord

__all__ = ["SCHEMA_VERSION", "Decision", "Fitness", "LineageStore", "Logged", "TrialRecord"]

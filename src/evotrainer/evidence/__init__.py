from evotrainer.evidence.records import EvidenceWriter, RolloutRecord, load_records, read_evidence
from evotrainer.evidence.store import EvidenceStore

__all__ = ["EvidenceStore", "EvidenceWriter", "RolloutRecord", "load_records", "read_evidence"]

from evotrainer.evidence.records import RolloutRecord, EvidenceWriter, read_evidence

__all__ = ["RolloutRecord", "EvidenceWriter", "read_evidence"]

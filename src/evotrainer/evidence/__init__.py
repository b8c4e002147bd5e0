from evotrainer.evidence.records import EvidenceWriter, RolloutRecord, load_records, read_evidence

__all__ = ["EvidenceWriter", "RolloutRecord", "load_records", "read_evidence"]

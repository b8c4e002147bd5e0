from evotrainer.evidence.records import (EvidenceWriter, RolloutRecord, evidence_of, load_records, read_evidence,
                                        read_metrics)
from evotrainer.evidence.store import EvidenceStore

__all__ = ["EvidenceStore", "EvidenceWriter", "RolloutRecord", "evidence_of", "load_records", "read_evidence",
           "read_metrics"]

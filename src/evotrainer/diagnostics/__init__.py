"""Diagnostics: metric functions over rollout evidence, thresholds, and the rule engine.

What harness code may import from here is this package's namespace, `spec`, `evidence`
and `library` (pure functions over plain data); `health`, `load` and `replay` do file
I/O or run harness code and are controller- or worker-side.
"""
from evotrainer.diagnostics.evidence_view import Evidence
from evotrainer.diagnostics.spec import DIAGNOSTICS, Diagnostic, Finding, diagnostic, findings, measure

__all__ = ["DIAGNOSTICS", "Diagnostic", "Evidence", "Finding", "diagnostic", "findings", "measure"]

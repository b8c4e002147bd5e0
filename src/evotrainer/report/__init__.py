"""The HTML report of a run or of one train directory: `write_report(dir)` (report/write.py)."""
from evotrainer.report.write import write_report

__all__ = ["write_report"]

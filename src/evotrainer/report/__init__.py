"""The HTML report of a run: `write_report(run_dir)` (report/page.py)."""
from evotrainer.report.page import write_report

__all__ = ["write_report"]

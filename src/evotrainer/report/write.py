"""`write_report`: the page a directory calls for (a run's, or one train directory's), written whole."""
from __future__ import annotations

from pathlib import Path

from evotrainer.report.gather import gather
from evotrainer.report.page import render, resolve_engine
from evotrainer.report.screen_page import render_screen
from evotrainer.report.train_page import render_train

SCREEN = "screen.md"  # what `evotrainer screen` leaves beside its rows


def write_report(run_dir: Path | str, out: Path | str | None = None, engine: str = "auto") -> dict:
    """The run's report; for a train directory without a lineage (one `train`, or another
    trainer's rollouts: integrations/trl.py, evidence/external.py), its training report; for a
    screen's directory (`evotrainer screen`), the screen's."""
    engine = resolve_engine(engine)   # a bad engine is refused before any reading
    path = Path(out) if out else Path(run_dir) / "report.html"
    if not (Path(run_dir) / "lineage.sqlite").is_file() and (Path(run_dir) / "evidence.jsonl").is_file():
        text, state, trials = render_train(Path(run_dir), engine), "trained", 0
    elif is_screen(Path(run_dir)):
        text, state, trials = render_screen(Path(run_dir), engine), "screened", 0
    else:
        data = gather(run_dir)
        text, state, trials = render(data, engine), data.status["state"], len(data.versions)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # a reader never sees half a report
    return {"report": str(path), "bytes": path.stat().st_size, "engine": engine, "state": state,
            "trials": trials, "charts": text.count('class="chart"') + text.count("plotly-graph-div")}


def is_screen(d: Path) -> bool:
    return not (d / "lineage.sqlite").is_file() and (d / SCREEN).is_file()

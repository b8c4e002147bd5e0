"""The live progress of training workers, read from their metrics files."""
from pathlib import Path

from evotrainer.evolve.segments.progress import Job, Watcher, steps_done


def test_steps_are_counted_from_metrics_lines_and_reported_when_they_move(tmp_path: Path):
    seg, sched = tmp_path / "v1" / "seed-0", tmp_path / "evolved" / "seed-100"
    jobs = [Job("v1 seed 0", seg, 10), Job("evolved seed 100", sched, 6)]
    seen = []
    poll = Watcher("trial 1", jobs, seen.append, every_s=0)
    poll()  # nothing written yet: zero, not an error
    assert seen[-1].done == 0 and seen[-1].total == 16
    seg.mkdir(parents=True)
    (seg / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    for d in (1, 2):  # a retrained schedule writes one directory per segment
        (sched / f"segment-{d}").mkdir(parents=True)
        (sched / f"segment-{d}" / "metrics.jsonl").write_text('{"step": 1}\n' * 3)
    poll()
    assert seen[-1].done == 8 and seen[-1].jobs == (("v1 seed 0", 2, 10), ("evolved seed 100", 6, 6))
    poll()  # unchanged: not reported again
    assert len(seen) == 2
    assert steps_done(tmp_path / "missing") == 0


def test_a_watcher_reads_the_files_at_most_once_per_interval(tmp_path: Path):
    seg = tmp_path / "v1" / "seed-0"
    seg.mkdir(parents=True)
    seen = []
    poll = Watcher("trial 1", [Job("v1 seed 0", seg, 10)], seen.append, every_s=3600)
    poll()
    (seg / "metrics.jsonl").write_text('{"step": 1}\n')
    poll()  # within the interval: the new line is not read yet
    assert [p.done for p in seen] == [0]
    poll.flush()  # the pool has returned: the last counts, at once
    assert [p.done for p in seen] == [0, 1]


def test_a_seeds_steps_follow_its_segments_and_a_half_written_line_is_skipped(tmp_path: Path):
    from evotrainer.evolve.segments.progress import seed_metrics
    seed = tmp_path / "evolved" / "seed-100"
    for d, body in ((1, '{"step": 1, "r": 0.1}\n{"step": 2, "r": 0.2}\n'),
                    (2, '{"step": 1, "r": 0.3}\n{"step": 2, "r": 0.4}\n{"step": 3, "r"')):  # segment 2 in flight
        (seed / f"segment-{d}").mkdir(parents=True)
        (seed / f"segment-{d}" / "metrics.jsonl").write_text(body)
    assert [(r["step"], r["r"]) for r in seed_metrics(seed)] == [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4)]
    assert seed_metrics(tmp_path / "missing") == []


def test_off_a_terminal_training_prints_a_line_per_quarter_with_the_time_left():
    """A log or a pipe gets no live bars: a line at each quarter of a title's steps, with the
    time spent and the estimate left; a count that is only a cap (the base's SFT) prints none."""
    import io

    from rich.console import Console

    from evotrainer.live import LiveDisplay
    now = [0.0]
    view = LiveDisplay(Console(file=io.StringIO(), force_terminal=False, width=200), clock=lambda: now[0])
    with view:
        for t, done in [(0, 0), (10, 10), (20, 40), (30, 50), (40, 100), (80, 200)]:
            now[0] = t
            view.training("trial 1: v1 [lower_lr] and control v0", [("v1 s0", done // 2, 100), ("v0 s0", done - done // 2, 100)])
        view.training("base", [("level 2", 300, 1500)], lines=False)
    lines = view.console.file.getvalue().splitlines()
    assert lines == ["  trial 1: v1 [lower_lr] and control v0: step 50 of 200 (25%), 0:00:30, about 0:01:30 left",
                     "  trial 1: v1 [lower_lr] and control v0: step 100 of 200 (50%), 0:00:40, about 0:00:40 left",
                     "  trial 1: v1 [lower_lr] and control v0: step 200 of 200 (100%), 0:01:20"]
    terminal = LiveDisplay(Console(file=io.StringIO(), force_terminal=True, width=200))
    with terminal:
        terminal.training("trial 1", [("v1 s0", 100, 100)])
    assert "step 100 of 100" not in terminal.console.file.getvalue()   # a terminal has the bars

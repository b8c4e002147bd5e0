"""`evotrainer report`: one self-contained HTML file of a real (small) run, opened in headless
Chromium: it renders (a screenshot that is not blank), it shows the tree, the curves and the
final table, and it makes no network request. Also a report of a run still in progress, and
the run's trackers (tracking.report_to) holding its steps, trials and final table."""
import json
import os
import re
import shutil

import pytest
from helpers import readable, tiny_run_config
from test_approval import next_wait, start

from evotrainer.cli import main

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# a root's closed network refuses Chromium's own background connections: keep them off
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def gated_run(tmp_path_factory, ckpt):
    """A tiny run of one trial paused at its completion approval (reported there), then let finish:
    a whole loop, so every test that reads it is marked slow."""
    d = readable(tmp_path_factory.mktemp("reported"))
    cfg, run = tiny_run_config(d, ckpt)
    events = []
    run, th, errors = start((cfg, run), None, trials=1, on_event=events.append,
                            approval={"at": ["completion"]}, final_seeds=[100], tracking={"report_to": ["tensorboard", "mlflow"]})
    gate = next_wait(run, th, errors)
    assert gate.trial == 1
    live = main(["report", str(run), "--out", str(d / "live.html"), "--engine", "svg"])
    assert live == 0
    while (gate := next_wait(run, th, errors)) is not None:
        assert main(["approve", str(run), str(gate.trial)]) == 0
    th.join()
    assert not errors, errors
    return run, d / "live.html", events


def browse(html_file, shot, wait_for: str | None = None):
    """Open a file in headless Chromium: (what its DOM shows, every URL it requested, script errors)."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("no chromium on the CI machine (scripts/test.sh installs Debian's package)")
        pytest.skip("no chromium here (Debian: apt-get install chromium)")
    requests, errors = [], []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
        # anything that would leave the machine is recorded and stopped
        ctx.route(re.compile(r"^(https?|wss?|ftp)://"), lambda route: route.abort())
        page = ctx.new_page()
        page.on("request", lambda r: requests.append(r.url))
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(html_file.as_uri(), wait_until="load")
        if wait_for:
            page.wait_for_function(wait_for, timeout=20_000)
        page.screenshot(path=str(shot), full_page=True)
        facts = page.evaluate("""() => ({
            nodes: document.querySelectorAll('#tree .node').length,
            best: document.querySelectorAll('#tree .node.best').length,
            pending: document.querySelectorAll('#tree .node.pending').length,
            plotly: document.querySelectorAll('.js-plotly-plot .main-svg').length,
            svg_charts: document.querySelectorAll('svg.chart').length,
            curves: [...document.querySelectorAll('[id^="curve-"]')].map(e => e.id),
            diagnostics: document.querySelectorAll('[id^="diag-"]').length,
            final: (document.querySelector('#final-table') || {}).innerText || '',
            trials: document.querySelectorAll('#trials tr').length - 1,
            scripts_with_src: document.querySelectorAll('script[src]').length,
            duplicate_ids: (ids => ids.filter((x, i) => ids.indexOf(x) !== i))(
                [...document.querySelectorAll('[id]')].map(e => e.id)),
            gate_drawn: document.querySelectorAll('div#gate .main-svg, svg#gate').length,
            meta: (m => m ? JSON.parse(m.textContent) : null)(document.querySelector('#report-meta'))})""")
        browser.close()
    return facts, requests, errors


def not_blank(png) -> tuple[int, float]:
    """(distinct colours, share of non-white pixels) of a screenshot."""
    from PIL import Image
    img = Image.open(png).convert("RGB")
    colours = img.getcolors(maxcolors=1 << 20) or []
    white = sum(n for n, c in colours if min(c) >= 250)
    return len(colours), 1 - white / (img.width * img.height)


def offline(requests) -> list[str]:
    return [u for u in requests if not u.startswith(("file:", "data:", "blob:", "about:"))]


def test_the_browser_check_sees_a_network_request(tmp_path):
    """The check below can fail: a page that loads a remote image is caught."""
    page = tmp_path / "remote.html"
    page.write_text('<html><body><img src="http://example.invalid/x.png"><p>hi</p></body></html>')
    _, requests, _ = browse(page, tmp_path / "remote.png")
    assert offline(requests) == ["http://example.invalid/x.png"]


@pytest.mark.slow
def test_report_of_a_finished_run_renders_offline_with_tree_curves_and_final_table(gated_run, tmp_path, capsys):
    pytest.importorskip("plotly")
    run, _, _ = gated_run
    capsys.readouterr()
    assert main(["report", str(run)]) == 0
    out = json.loads(capsys.readouterr().out)
    html_file = run / "report.html"
    assert out["report"] == str(html_file) and out["engine"] == "plotly" and out["state"] == "finished"
    assert out["bytes"] == html_file.stat().st_size > 1_000_000   # plotly.js inlined
    shot = tmp_path / "report.png"
    facts, requests, errors = browse(html_file, shot, "document.querySelectorAll('.js-plotly-plot').length >= 5")
    print(f"screenshot: {shot}, report {out['bytes']} bytes")
    assert offline(requests) == [] and errors == []
    assert facts["scripts_with_src"] == 0 and facts["duplicate_ids"] == [] and facts["gate_drawn"] >= 1
    assert facts["nodes"] == facts["trials"] == 2 and facts["pending"] == 0   # the root and trial 1
    assert facts["best"] >= 1                                              # the path to the winner
    assert {"curve-reward_mean", "curve-score_mean", "curve-entropy"} <= set(facts["curves"])
    assert facts["plotly"] >= 5 and facts["diagnostics"] >= 1
    assert "evolved - reference" in facts["final"] and "reference" in facts["final"]
    colours, ink = not_blank(shot)
    assert colours > 50 and ink > 0.02, (colours, ink)


@pytest.mark.slow
def test_report_without_plotly_draws_static_svg(gated_run, tmp_path, capsys):
    run, _, _ = gated_run
    html_file = tmp_path / "plain.html"
    assert main(["report", str(run), "--out", str(html_file), "--engine", "svg"]) == 0
    assert "<script type=\"text/javascript\">" not in html_file.read_text()   # no plotly, no script
    facts, requests, errors = browse(html_file, tmp_path / "plain.png")
    assert offline(requests) == [] and errors == []
    assert facts["nodes"] == 2 and facts["svg_charts"] >= 5 and facts["plotly"] == 0
    assert facts["duplicate_ids"] == [] and facts["gate_drawn"] == 1
    assert "evolved - reference" in facts["final"]
    colours, ink = not_blank(tmp_path / "plain.png")
    assert colours > 20 and ink > 0.02, (colours, ink)


@pytest.mark.slow
def test_report_of_a_run_in_progress(gated_run, tmp_path):
    """Written while trial 1 waited at its gate: the root is in the tree, trial 1 is in flight
    (its node and row say so, its curves are on disk), and there is no final comparison yet."""
    _, live, _ = gated_run
    facts, requests, errors = browse(live, tmp_path / "live.png")
    assert offline(requests) == [] and errors == []
    assert facts["meta"]["state"] == "running or interrupted"
    assert facts["nodes"] == facts["trials"] == 2 and facts["pending"] == 1
    assert "no final comparison yet" in facts["final"]
    assert "curve-reward_mean" in facts["curves"]
    assert "1 in flight" in live.read_text()


@pytest.mark.slow
def test_the_runs_trackers_hold_its_steps_trials_and_final_table(gated_run):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    run, _, _ = gated_run
    tb = run / "trackers" / "tensorboard"

    def scalars(sub, tag):
        acc = EventAccumulator(str(tb / sub))
        acc.Reload()
        return [(e.step, e.value) for e in acc.Scalars(tag)]

    metrics = [json.loads(x) for x in (run / "versions" / "v0" / "seed-0" / "metrics.jsonl").read_text().splitlines()]
    got = scalars("v0/seed-0", "entropy")   # a metric that moves on a random-init policy
    assert [s for s, _ in got] == [m["step"] for m in metrics]
    assert [v for _, v in got] == pytest.approx([m["entropy"] for m in metrics])
    assert len(set(v for _, v in got)) > 1
    assert [s for s, _ in scalars("search", "trial/val")] == [0, 1]
    final = json.loads((run / "final.json").read_text())
    (step, value), = scalars("search", "final/evolved/test")
    assert value == pytest.approx(final["comparison"]["test"]["evolved"]["mean"])
    assert (tb / "final" / "evolved" / "seed-100").is_dir()
    # mlflow: the same steps in a nested run of the run's parent run
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking_uri=f"sqlite:///{run / 'trackers' / 'mlflow' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("evotrainer")
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    assert {"v0/seed-0", "final/evolved/seed-100", run.name} <= set(runs)
    hist = sorted((m.step, m.value) for m in client.get_metric_history(runs["v0/seed-0"].info.run_id, "entropy"))
    assert [s for s, _ in hist] == [s for s, _ in got] and [v for _, v in hist] == pytest.approx([v for _, v in got])
    assert runs["v0/seed-0"].data.tags["mlflow.parentRunId"] == runs[run.name].info.run_id


@pytest.mark.slow
def test_the_live_view_shows_each_stage_and_a_bar_per_training_worker(gated_run):
    """The run's own events, replayed into the live view `evotrainer run` draws."""
    import io

    from rich.console import Console

    from evotrainer.evolve.notices import Stage
    from evotrainer.evolve.segments.progress import Progress
    from evotrainer.live import LiveDisplay
    _, _, events = gated_run
    stages = [e.text for e in events if isinstance(e, Stage)]
    order = ["trial 0: the root harness v0 trains", "the evaluator scores v0", "trial 1: the rules agent proposes",
             "trial 1 v1 [", "backtest: v1 rescores v0's cached rollouts", "trains v1 beside its control",
             "the evaluator scores v1", "gate: paired gain", "final comparison: "]
    at = [next(i for i, s in enumerate(stages) if o in s) for o in order]
    assert at == sorted(at), stages
    console = Console(file=io.StringIO(), force_terminal=True, width=140)
    view = LiveDisplay(console)
    seen = []
    with view:
        for e in events:
            if isinstance(e, Stage):
                view.set_stage(e.text)
            elif isinstance(e, Progress):
                view.training(e.title, e.jobs)
                view.live.refresh()   # drawn now (live draws 4 times a second; a replay is faster)
                seen.append((view.stage.plain, view.rows()))
    trial1 = [(st, rows) for st, rows in seen if st.startswith("trial 1 v1")]
    assert trial1, seen
    stage, rows = trial1[-1]
    # continue mode: the child and its control (the parent continued), each its own bar, each done
    assert [r[0] for r in rows] == ["v1 s0", "v0-d2 s0"] and all(r[1] == r[2] == 2 for r in rows)
    out = console.file.getvalue()
    assert "v1 s0" in out and "v0-d2 s0" in out and "trial 1 v1 [" in out

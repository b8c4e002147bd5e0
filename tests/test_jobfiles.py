"""The trusted side's reads of a job's directory (jobfiles.py) and the vetting of what a
training job leaves (trainer/outputs.py): every trick a job can play with its own files is
refused in one line, never followed, never blocks."""
import json
import os
import threading
from pathlib import Path

import pytest

from evotrainer import jobfiles
from evotrainer.jobfiles import BadOutput
from evotrainer.policy import build_model, build_tokenizer, save_policy
from evotrainer.trainer.outputs import keep_log, log_path, refused, scheduled_checkpoints, vet_segment


@pytest.fixture
def outside(tmp_path) -> Path:
    f = tmp_path / "outside.txt"
    f.write_text("the controller's own file\n")
    return f


def test_a_link_anywhere_below_the_directory_is_refused_not_followed(tmp_path, outside):
    job = tmp_path / "job"
    (job / "sub").mkdir(parents=True)
    os.symlink(outside, job / "file")
    os.symlink(outside.parent, job / "sub" / "dir")
    for rel in ("file", "sub/dir/outside.txt"):
        with pytest.raises(BadOutput, match="symbolic link|where a directory should be"):
            jobfiles.read_bytes(job, rel, 1000)
        assert not jobfiles.exists(job, rel)
    os.symlink(job / "sub", tmp_path / "linked-root")  # the directory itself, named through a link
    with pytest.raises(BadOutput):
        jobfiles.read_bytes(tmp_path / "linked-root", "x", 10)


def test_a_fifo_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "metrics.jsonl")
    done = []
    t = threading.Thread(target=lambda: done.append(jobfiles.count_lines(tmp_path, "metrics.jsonl", 100)), daemon=True)
    t.start()
    t.join(5)
    assert done == [0]  # answered at once: nothing is written to the FIFO, nothing waits on it
    with pytest.raises(BadOutput, match="not a regular file"):
        jobfiles.read_jsonl(tmp_path, "metrics.jsonl", 100, dict)


def test_reads_are_capped_and_a_log_is_read_from_its_tail(tmp_path):
    (tmp_path / "big").write_bytes(b"x" * 1000 + b"END")
    with pytest.raises(BadOutput, match="more than the 100 read"):
        jobfiles.read_bytes(tmp_path, "big", 100)
    assert jobfiles.read_text(tmp_path, "big", 10, tail=True) == "xxxxxxxEND"
    assert jobfiles.count_lines(tmp_path, "big", 10) == 0


def test_json_is_checked_for_its_shape(tmp_path):
    (tmp_path / "run.json").write_text("[1, 2]")
    with pytest.raises(BadOutput, match="not a JSON object"):
        jobfiles.read_json(tmp_path, "run.json")
    (tmp_path / "run.json").write_text("{")
    with pytest.raises(BadOutput, match="is not JSON"):
        jobfiles.read_json(tmp_path, "run.json")
    (tmp_path / "m.jsonl").write_text('{"step": 1}\n[]\n')
    with pytest.raises(BadOutput, match="line 2: not a JSON object"):
        jobfiles.read_jsonl(tmp_path, "m.jsonl", 100, dict)
    (tmp_path / "m.jsonl").write_text('{"step": 1}\n{"step": 2')  # being written: the last line waits
    assert jobfiles.read_jsonl(tmp_path, "m.jsonl", 100, dict, growing=True) == [{"step": 1}]


def test_the_controllers_own_file_replaces_a_planted_link(tmp_path, outside):
    os.symlink(outside, tmp_path / "segment.key")
    jobfiles.write_text(tmp_path, "segment.key", "k1\n")
    assert outside.read_text() == "the controller's own file\n"
    assert not (tmp_path / "segment.key").is_symlink() and (tmp_path / "segment.key").read_text() == "k1\n"
    (tmp_path / "summary.json").mkdir()
    with pytest.raises(BadOutput, match="cannot be replaced"):
        jobfiles.write_text(tmp_path, "summary.json", "{}")


def test_walk_and_copy_take_plain_trees_only(tmp_path, outside):
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "f").write_text("1")
    (src / "g").write_text("22")
    jobfiles.copy_tree(src, tmp_path / "dst", skip=("g",))
    assert (tmp_path / "dst" / "a" / "f").read_text() == "1" and not (tmp_path / "dst" / "g").exists()
    os.symlink(outside, src / "a" / "link")
    with pytest.raises(BadOutput, match="a/link .* is a symbolic link"):
        jobfiles.copy_tree(src, tmp_path / "dst2")
    with pytest.raises(BadOutput, match="more than 2 files"):
        list(jobfiles.walk(src, limit=2))


# ------------------------------------------------------------------ a segment's directory


def segment(out: Path, steps: int = 2, every: int = 1) -> Path:
    """A train directory as a 2-step segment with a checkpoint every step writes it."""
    tok = build_tokenizer()
    model = build_model(len(tok), hidden=16, layers=1, heads=2, ffn=32)
    for c in scheduled_checkpoints(out, steps, every):
        save_policy(model, tok, c)
    (out / "run.json").write_text(json.dumps({"task": "arith", "seed": 0, "steps": steps, "group_size": 2,
                                              "max_new_tokens": 8, "trainable_params": 10}))
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward_mean": 0.5}) + "\n"
                                               for s in range(1, steps + 1)))
    row = {"step": 1, "group_id": 0, "prompt_id": "p", "prompt": "1+1=", "answer": "2", "level": 1,
           "completion": "2", "score": 1.0, "reward": 1.0, "advantage": 0.0, "length": 2, "truncated": False,
           "mean_logprob": -0.1, "entropy": 0.2, "kept": True, "turns": None, "tool_calls": None,
           "tool_failures": None, "tool_sequence": None, "stop": None, "terminated": None, "files_read": None,
           "files_edited": None, "target_files": None, "tests_run": None, "git_access": None, "partial": None,
           "outcome": None, "failure": None}
    (out / "evidence.jsonl").write_text(json.dumps(row) + "\n" + json.dumps(row | {"step": 2}) + "\n")
    return out


@pytest.fixture
def trained(tmp_path) -> Path:
    return segment(tmp_path / "seed-0")


def test_an_untouched_segment_passes(trained):
    vet_segment(trained, 2, 1)
    assert refused(trained, 2, 1, None) is None


@pytest.mark.parametrize("tamper, why", [
    (lambda d: __import__("shutil").rmtree(d / "checkpoints"), r"checkpoints \[\] where the run's schedule"),
    (lambda d: (d / "checkpoints" / "step-x").mkdir(), r"checkpoints \[step-1, step-x\]"),
    (lambda d: (d / "checkpoints" / "step-1").rename(d / "checkpoints" / "step-01"), r"checkpoints \[step-01\]"),
    (lambda d: __import__("shutil").rmtree(d / "checkpoint"), "checkpoint' is not a directory"),
    (lambda d: (d / "evidence.jsonl").open("a").write("{\n"), "evidence.jsonl line 3"),
    (lambda d: (d / "evidence.jsonl").write_text('{"step": "one"}\n'), "evidence.jsonl"),
    (lambda d: (d / "metrics.jsonl").write_text('{"step": 1}\n'), r"holds steps \[1\], not 1 to 2"),
    (lambda d: (d / "run.json").write_text("[]"), "not a JSON object"),
    (lambda d: (d / "run.json").write_text('{"task": "arith"}'), "has no seed"),
    (lambda d: os.mkfifo(d / "x.fifo"), "x.fifo .* is not a regular file"),
    (lambda d: os.symlink("/etc/passwd", d / "checkpoint" / "config.json.bak"), "is a symbolic link"),
    (lambda d: (d / "checkpoint" / "chat_template.py").write_text(""), "not a file a checkpoint holds"),
])
def test_each_tampering_is_refused_in_one_line(trained, tamper, why):
    tamper(trained)
    reason = refused(trained, 2, 1, None)
    assert reason is not None and "\n" not in reason
    assert __import__("re").search(why, reason), reason


def test_the_schedule_not_the_job_names_the_scored_checkpoints(tmp_path):
    assert [c.relative_to(tmp_path).as_posix() for c in scheduled_checkpoints(tmp_path, 150, 25)] == [
        *(f"checkpoints/step-{s}" for s in (25, 50, 75, 100, 125)), "checkpoint"]
    assert scheduled_checkpoints(tmp_path, 2, 0) == [tmp_path / "checkpoint"]


def test_the_log_is_kept_beside_the_job_where_a_planted_link_is_not_followed(tmp_path, outside):
    out = tmp_path / "seed-0"
    out.mkdir()
    os.symlink(outside, out / "worker.log")  # what the job planted inside: nobody writes there now
    os.symlink(outside, log_path(out))        # and even a link at the log's own name is replaced
    assert keep_log(out, "traceback\n") == tmp_path / "seed-0.log"
    assert outside.read_text() == "the controller's own file\n" and log_path(out).read_text() == "traceback\n"


# ------------------------------------------------------------------ who reads a job's files
# The trusted side's modules: what runs in the controller, the evaluator's launcher and the CLI.
TRUSTED = ("evolve/", "report/", "cli.py", "trainer/run.py", "trainer/outputs.py", "backtest/run.py",
           "diagnostics/health.py", "diagnostics/replay.py", "diagnostics/load.py", "evidence/",
           "executors/worker.py", "executors/pool.py", "executors/ray_tasks.py")
# Every reader of a job's output directory, and how: through jobfiles, or a reader that is
JOB_READERS = {
    "evidence/records.py:read_evidence": "evidence.jsonl, each record checked",
    "evidence/records.py:read_metrics": "metrics.jsonl, each line checked",
    "evidence/records.py:evidence_of": "read_evidence, keyed by lstat",
    "trainer/outputs.py:vet_segment": "the whole directory, once, when the job ends",
    "trainer/outputs.py:read_run_meta": "run.json, its fields checked",
    "trainer/outputs.py:keep_log": "writes the log beside the job's directory",
    "trainer/run.py:train_run": "the `train` command: vets, then summary.json as a new file",
    "trainer/run.py:_metrics_follower": "progress of `train`",
    "evolve/segments/progress.py:steps_done": "progress: counts lines, a FIFO counts none",
    "evolve/segments/progress.py:seed_metrics": "curves for trackers and the report",
    "evolve/segments/cache.py:marked_key": "the controller's mark in a train directory",
    "evolve/segments/cache.py:name_train_spec": "run.json of a materialised directory",
    "evolve/segments/cache.py:_job_files": "a parent checkpoint's files (tree_digest, job=True)",
    "evolve/segments/cache.py:SegmentCache.store": "copies a vetted directory into the cache",
    "evolve/segments/pipeline.py:Segments._vet": "vets each job when it ends, keeps its log",
    "evolve/segments/pipeline.py:Segments._reuse": "keeps the log of a job materialised from the cache",
    "evolve/segments/training.py:Training.train": "run.json of a vetted job, for the clock",
    "evolve/segments/training.py:Training.ingest_missing": "which finished states' evidence is there",
    "diagnostics/health.py:load_evidence": "evidence and metrics, in place or in a worker",
    "diagnostics/health.py:evidence_dirs": "which directories hold evidence",
    "diagnostics/health.py:_plain_copy": "a train directory's copy of its harness",
    "diagnostics/replay.py:replay": "which directories hold evidence",
    "backtest/run.py:backtest": "evidence, and the rescore worker's result checked",
    "report/gather.py:diagnostics_over_time": "evidence for the report; a refused one is left out",
    "report/train_page.py:glance": "run.json of a train directory",
    "report/train_page.py:render_train": "evidence of a train directory",
    "executors/worker.py:_Job._label": "result.json, capped, no link, no FIFO",
    "executors/worker.py:refused_output": "every job's output when it ends",
}
VETTED = ("jobfiles.", "evidence_of(", "read_metrics(", "read_run_meta(", "load_evidence(", "refused(", "keep_log(",
          "read_evidence(")
# Direct file access on the trusted side that is not a job's directory, each with why
NOT_JOB_FILES = {
    "backtest/run.py:rest_key": "a harness checkout of the run's repository (the controller's)",
    "cli.py:cmd_backtest": "writes the report where the user asked (--out)",
    "cli.py:cmd_status": "final.md, the controller's",
    "diagnostics/health.py:write_reports": "writes the health report where the user asked",
    "diagnostics/replay.py:revised_diagnostics.parse": "a harness checkout's diagnostics.py, parsed, never run",
    "evidence/records.py:EvidenceWriter.__init__": "the job's own writer, inside the job",
    "evolve/approval.py:submit": "a person's decision file in the run directory",
    "evolve/approval.py:wait_for": "a person's decision file in the run directory",
    "evolve/harnesses.py:Harnesses.candidate": "a harness checkout",
    "evolve/harnesses.py:Harnesses.files": "a harness checkout",
    "evolve/final_run.py:run_final": "writes final.json and final.md in the run directory",
    "evolve/landscape.py:backtests": "appends the table's backtests.jsonl (the builder's record)",
    "evolve/landscape.py:build.record": "appends the table's rows.jsonl (the builder's record)",
    "evolve/landscape.py:changed_knobs": "harness directories the builder or the controller wrote",
    "evolve/landscape.py:content_key": "harness directories the builder or the controller wrote",
    "evolve/landscape.py:read_backtests": "the table's records, written by the builder",
    "evolve/landscape.py:read_rows": "the table's records, written by the builder",
    "evolve/landscape.py:screen": "writes screen.md in the screen's directory",
    "evolve/landscape.py:write_harness": "copies a harness checkout into the table's harnesses/",
    "evolve/simulate.py:Table.load": "the table's meta.json, written by the builder",
    "evolve/simulate.py:_change": "harness directories the builder or the controller wrote",
    "evolve/search/policy.py:_write": "the controller's policy files",
    "evolve/search/policy.py:write_files": "the controller's policy files",
    "evolve/segments/cache.py:SegmentCache.lookup": "an entry's MANIFEST, the controller's",
    "evolve/segments/cache.py:SegmentCache.materialise": "copies an entry into a directory it just emptied",
    "evolve/segments/cache.py:SegmentCache.score": "a cached score, the controller's",
    "evolve/segments/cache.py:SegmentCache.store": "writes the entry's MANIFEST",
    "evolve/segments/cache.py:SegmentCache.store_score": "writes a cached score",
    "evolve/segments/cache.py:_files_digest": "os.open for the base and harness checkouts; jobfiles with job=True",
    "evolve/segments/cache.py:_link_or_copy": "an entry's file into a directory the controller made",
    "evolve/segments/cache.py:file_digest": "a task's data files, the user's",
    "evolve/setup.py:save_config": "the run config",
    "executors/worker.py:_Job._start": "the job's spec files, in the controller's own directory",
    "executors/worker.py:_rss_pages": "/proc",
    "executors/worker.py:_writer_lock": "a lock beside an output directory, in its parent (the controller's)",
    "report/gather.py:gather": "final.json and config.yaml, the controller's",
    "report/write.py:write_report": "writes the report",
}
DIRECT = {"open", "read_text", "read_bytes", "write_text", "write_bytes", "copytree", "copy2", "copyfile"}
SRC = Path(__file__).resolve().parents[1] / "src" / "evotrainer"


def _functions():
    """(module-relative path:qualified function, its node) of every function on the trusted side."""
    import ast
    for f in sorted(SRC.rglob("*.py")):
        rel = f.relative_to(SRC).as_posix()
        if not rel.startswith(TRUSTED):
            continue
        stack = []

        def visit(node):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    stack.append(child.name)
                    if not isinstance(child, ast.ClassDef):
                        yield f"{rel}:{'.'.join(stack)}", child
                    yield from visit(child)
                    stack.pop()
        yield from visit(ast.parse(f.read_text()))


def _direct(fn) -> bool:
    """Whether a function (not the functions inside it) opens, reads, writes or copies a file itself."""
    import ast
    todo = list(ast.iter_child_nodes(fn))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        todo += ast.iter_child_nodes(node)
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else None
            if name in DIRECT and owner not in ("jobfiles", "yaml", "json", "torch") and \
                    not (name == "open" and owner not in (None, "os", "io")):
                return True
    return False


def test_every_reader_of_a_jobs_directory_reads_through_jobfiles():
    import ast
    funcs = dict(_functions())
    for name, why in JOB_READERS.items():
        assert name in funcs, f"{name} ({why}) is gone: update the list"
        source = ast.unparse(funcs[name])
        assert any(v in source for v in VETTED), f"{name} reads a job's files ({why}) without jobfiles"


def test_no_other_file_access_on_the_trusted_side():
    direct = {name for name, fn in _functions() if _direct(fn)}
    new = sorted(direct - set(NOT_JOB_FILES))
    assert not new, (f"file access on the trusted side not listed: {new}; read a job's files through "
                     "evotrainer.jobfiles, or list it in NOT_JOB_FILES with why it reads none")
    assert not sorted(set(NOT_JOB_FILES) - direct), "listed but gone: update NOT_JOB_FILES"

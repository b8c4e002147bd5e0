"""What a training job leaves behind, vetted on the trusted side before anything reads or keeps it.

A job ran harness code, so its directory is hostile input (jobfiles.py). When it ends the
controller vets it once, before the evaluator scores it, the findings read it or the segment
cache keeps it: only directories and regular files, no more than a job writes; exactly the
checkpoints the run's schedule names (`scheduled_checkpoints`: the run decides what is
scored, never the job, so a job that deletes, adds or renames a checkpoint cannot change the
average its fitness is); each checkpoint what save_policy writes, with weights of the base's
shapes; run.json, metrics.jsonl and evidence.jsonl parse and have their fields. Whatever is
wrong raises BadOutput, one line, which labels the trial `bad_output`.
"""
from __future__ import annotations

from pathlib import Path

from evotrainer import jobfiles
from evotrainer.errors import UsageError
from evotrainer.evidence.records import evidence_of, read_metrics
from evotrainer.jobfiles import BadOutput, shown

CHECKPOINT, CHECKPOINTS = "checkpoint", "checkpoints"
# the controller's mark on a train directory that holds a cache entry exactly (evolve/segments/cache.py);
# a job that left one would claim another entry's scores
KEY_FILE = "segment.key"
# run.json: what readers take from it (backtests: group_size, max_new_tokens; the report; the
# clock: trainable_params), each with the JSON types it may hold
RUN_FIELDS = {"task": (str,), "seed": (int,), "steps": (int,), "group_size": (int,), "max_new_tokens": (int,),
              "level": (int, type(None)), "prompts_per_step": (int,), "harness_hash": (str,), "backend": (str,),
              "trainable_params": (int,), "lora": (dict, type(None)), "data_parallel": (int,)}
REQUIRED = ("task", "seed", "steps", "group_size", "max_new_tokens")


def scheduled_steps(steps: int, every: int) -> list[int]:
    """The steps a segment of `steps` saves a checkpoint at, every `every` (trainer/segment.py);
    the last step's is the segment's checkpoint/, not one of these."""
    return list(range(every, steps, every)) if every > 0 else []


def scheduled_checkpoints(out: Path | str, steps: int, every: int) -> list[Path]:
    """Every checkpoint of a train directory the schedule names, in step order, the final one last."""
    out = Path(out)
    return [*(out / CHECKPOINTS / f"step-{s}" for s in scheduled_steps(steps, every)), out / CHECKPOINT]


def read_run_meta(out: Path | str) -> dict:
    """A train directory's run.json, its fields of the types readers take."""
    meta = jobfiles.read_json(out, "run.json")
    for k, kinds in RUN_FIELDS.items():
        if k in REQUIRED and k not in meta:
            raise BadOutput(f"{shown(Path(out, 'run.json'))} has no {k}")
        v = meta.get(k)
        if k in meta and not (isinstance(v, kinds) and (isinstance(v, bool) == (bool in kinds))):
            raise BadOutput(f"{shown(Path(out, 'run.json'))}: {k} is {type(v).__name__}")
    return meta


def vet_segment(out: Path | str, steps: int, every: int, check_weights=None) -> None:
    """Raise BadOutput unless train directory `out` holds what a segment of `steps` steps,
    checkpointed every `every`, writes. `check_weights(checkpoint) -> reason | None` vets a
    checkpoint's weights against the run's base (None: its files are checked, not its shapes)."""
    from evotrainer.policy.model import BadCheckpoint, check_checkpoint  # torch: not at import
    out = Path(out)
    list(jobfiles.walk(out))  # no link, FIFO or device anywhere, and no more than a job writes
    if KEY_FILE in jobfiles.listdir(out):
        raise BadOutput(f"{shown(out)}: a job may not write {KEY_FILE}, the controller's mark of a cache entry")
    want = [c.name for c in scheduled_checkpoints(out, steps, every)[:-1]]
    have = jobfiles.listdir(out, CHECKPOINTS)
    if have != sorted(want):
        raise BadOutput(f"{shown(out)}: checkpoints {_names(have)} where the run's schedule (every {every} "
                        f"of {steps} steps) saves {_names(want)}")
    for c in scheduled_checkpoints(out, steps, every):
        try:
            check_checkpoint(c, written=True)
        except BadCheckpoint as e:
            raise BadOutput(str(e)) from None
        why = check_weights(c) if check_weights is not None else None
        if why:
            raise BadOutput(f"{shown(c)}: {why}")
    meta = read_run_meta(out)
    if meta["steps"] != steps:
        raise BadOutput(f"{shown(out / 'run.json')} says {meta['steps']} steps, the segment had {steps}")
    rows = read_metrics(out)
    if [r["step"] for r in rows] != list(range(1, steps + 1)):
        raise BadOutput(f"{shown(out / 'metrics.jsonl')} holds steps {_names([r['step'] for r in rows])}, "
                        f"not 1 to {steps}")
    try:
        records = evidence_of(out / "evidence.jsonl")
    except UsageError as e:  # records that lack fields: read as another trainer's export, and refused
        raise BadOutput(str(e)) from None
    if any(not 1 <= r.step <= steps for r in records):
        raise BadOutput(f"{shown(out / 'evidence.jsonl')} holds a record outside steps 1 to {steps}")


def refused(out: Path | str, steps: int, every: int, base: str | None, segments: int = 0) -> str | None:
    """Why the trusted side refuses what a finished training job wrote in `out`, else None:
    one segment, or (`segments` > 0) a schedule's segment-1 .. segment-N. `base`: the run's
    base model, whose weights' names and shapes every checkpoint must have (None: unchecked)."""
    dirs = [Path(out)] if not segments else [Path(out, f"segment-{d}") for d in range(1, segments + 1)]
    try:
        for d in dirs:
            vet_segment(d, steps, every, None if base is None else lambda c: _weights(c, base))
    except BadOutput as e:
        return str(e)
    return None


def _weights(checkpoint: Path, base: str) -> str | None:
    from evotrainer.policy.model import check_weights  # torch: not at import
    return check_weights(checkpoint, base)


def _names(items) -> str:
    items = [shown(i) for i in items]
    return "[" + ", ".join(items[:6]) + (f", ... {len(items)} in all" if len(items) > 6 else "") + "]"


def log_path(out: Path | str) -> Path:
    """Where the controller keeps a job's log: beside its directory, where the job cannot write
    (a worker.log inside it could be a link the job planted to any file the controller can write)."""
    out = Path(out)
    return out.with_name(out.name + ".log")


def keep_log(out: Path | str, text: str) -> Path:
    """A job's log tail, written at log_path(out) as a new file (a link there is replaced, not followed)."""
    path = log_path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    jobfiles.write_text(path.parent, path.name, text)
    return path

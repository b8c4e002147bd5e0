"""The worker side of `run_in_worker`: run the target, write the outcome as JSON.

Workers never download: the controller resolves every model to a local directory, so
Hugging Face offline mode is set here (and by the sandbox's environment), in our own
process, not in the user's. The result crosses back as JSON: a value that is not plain
data (numbers, strings, lists, dicts) is a crash, never a pickle its caller would run.

The job directory is the controller's (executors.worker): the job reads its JOB file there,
read-only, and writes its result into OUT, the one directory of it that is its own; the
sandbox's spec beside them is out of its reach."""
from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

# (its package, and so the worker module, is imported already: this runs as -m)
from evotrainer.executors.targets import resolve
from evotrainer.executors.worker import JOB, OUT, RESULT


def main(job_dir: str) -> int:
    job_dir = Path(job_dir)
    job = json.loads((job_dir / JOB).read_text())
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ.setdefault(var, "1")
    if job.get("isolation"):  # programs this job runs (sandbox.programs) get the run's level, not a new probe
        from evotrainer.sandbox import Isolation  # (which a job inside namespaces could not repeat as a non-root user)
        from evotrainer.sandbox.processes import use_isolation
        use_isolation(Isolation(job["isolation"]))
    if job.get("threads"):
        import torch  # every target here uses torch; cap it before the target builds anything
        torch.set_num_threads(job["threads"])
    try:
        value = resolve(job["target"])(**job["kwargs"])
        out = {"label": "ok", "value": value}
    except MemoryError:
        traceback.print_exc()
        out = {"label": "oom", "error": "MemoryError: ran past the worker's memory limit"}
    except BaseException as e:  # the harness's own bugs end up here, with their traceback
        traceback.print_exc()
        out = {"label": "crash", "error": f"{type(e).__name__}: {e}"[:500]}
    try:
        blob = json.dumps(out, allow_nan=False)
    except (TypeError, ValueError) as e:
        blob = json.dumps({"label": "crash", "error": f"result is not plain JSON data: {e}"[:500]})
    sys.stdout.flush()
    sys.stderr.flush()
    (job_dir / OUT / RESULT).write_text(blob)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

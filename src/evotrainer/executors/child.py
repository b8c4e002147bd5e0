"""The worker side of `run_in_worker`: run the target, pickle the outcome.

Workers never download: the controller resolves every model to a local directory, so
Hugging Face offline mode is set here, in our own process, not in the user's."""
from __future__ import annotations

import importlib
import os
import pickle
import sys
import traceback
from pathlib import Path


def main(job_dir: str, wait: bool = False) -> int:
    job_dir = Path(job_dir)
    if wait:  # a warm worker (worker.Warm): import what every job needs, then wait for the job
        import torch  # noqa: F401
        import evotrainer.harness  # noqa: F401
        sys.stdin.buffer.read()  # EOF: the caller gave the job, closed it unused, or died
        if not (job_dir / "job.pkl").exists():
            return 0
    job = pickle.loads((job_dir / "job.pkl").read_bytes())
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ.setdefault(var, "1")
    if job.get("threads"):
        import torch  # every target here uses torch; cap it before the target builds anything
        torch.set_num_threads(job["threads"])
    try:
        module, _, name = job["target"].partition(":")
        value = getattr(importlib.import_module(module), name)(**job["kwargs"])
        out = {"label": "ok", "value": value}
    except MemoryError:
        traceback.print_exc()
        out = {"label": "oom", "error": "MemoryError: ran past the worker's memory limit"}
    except BaseException as e:  # the harness's own bugs end up here, with their traceback
        traceback.print_exc()
        out = {"label": "crash", "error": f"{type(e).__name__}: {e}"[:500]}
    try:
        blob = pickle.dumps(out)
    except Exception as e:
        blob = pickle.dumps({"label": "crash", "error": f"result is not picklable: {e}"[:500]})
    sys.stdout.flush()
    sys.stderr.flush()
    (job_dir / "result.pkl").write_bytes(blob)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], wait="--wait" in sys.argv[2:]))

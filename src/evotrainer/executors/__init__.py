from evotrainer.executors.worker import WorkerResult, run_in_worker

__all__ = ["WorkerResult", "run_in_worker"]

from evotrainer.executors.worker import Call, WorkerResult, run_all, run_in_worker

__all__ = ["Call", "WorkerResult", "run_all", "run_in_worker"]

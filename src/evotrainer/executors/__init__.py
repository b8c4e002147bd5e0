from evotrainer.executors.worker import Call, Warm, WorkerResult, run_all, run_in_worker

__all__ = ["Call", "Warm", "WorkerResult", "run_all", "run_in_worker"]

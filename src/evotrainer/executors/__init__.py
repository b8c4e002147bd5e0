from evotrainer.executors.worker import Call, Warm, WorkerResult, isolation, run_all, run_in_worker, use_isolation

__all__ = ["Call", "Warm", "WorkerResult", "isolation", "run_all", "run_in_worker", "use_isolation"]

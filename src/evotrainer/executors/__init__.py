from evotrainer.executors.pool import Executor, LocalPool
from evotrainer.executors.targets import target_of
from evotrainer.executors.worker import Call, WorkerResult, isolation, run_all, run_in_worker, use_isolation

__all__ = ["Call", "Executor", "LocalPool", "WorkerResult", "isolation", "run_all", "run_in_worker",
           "target_of", "use_isolation"]

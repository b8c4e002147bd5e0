"""Jobs as Ray tasks: the executor for a cluster (run config `executor: ray`).

Each Call becomes one Ray task that runs it exactly as the local pool does, through `run_all`
on the node the task lands on: the job is sandboxed there (its namespaces, read-only
filesystem, memory watch) and its result comes back as the same small JSON WorkerResult.
Tasks, not actors: an actor cannot be cancelled with force.

    deadline   the task yields once as it starts on its node (time queued for resources does
               not count); `timeout_s` after that the driver cancels it with force, which
               kills the Ray worker process, and the sandboxed job with it (it is started
               to die with its parent), and labels it `timeout`. The task's own run_all has
               a later deadline (+ GRACE_S) that ends the job should the driver vanish.
    retries    a job lost with its worker or node is submitted again, at most `retries`
               times, each attempt with a deadline of its own; past that it is `crash`, with
               why. A timeout, an oom or the job's own failure is never retried. (Ray's own
               retries are off: the driver must see every attempt to give it its deadline.)
    resources  each task asks Ray for `num_cpus` (also its intra-op threads), `num_gpus`
               and `memory_mb`; a request no node of the cluster can hold is refused before
               anything is submitted, rather than queued forever.

Calls name absolute paths (the run directory, the base checkpoint, harness checkouts): every
node must see them at the same path, on a shared filesystem (docs/scaling.md).
"""
from __future__ import annotations

import dataclasses
import functools
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from evotrainer.errors import UsageError
from evotrainer.executors.pool import Executor
from evotrainer.executors.worker import Call, NamedCall, WorkerResult

GRACE_S = 60.0      # the node's own deadline past the driver's (a driver that died cannot cancel)
CANCEL_WAIT_S = 30.0  # how long a force-cancel may take to land before the driver moves on
STARTED = "started"


def _job(call: dict, *, timeout_s: float, memory_mb: int | None, threads: int, level: str,
         concealed: list[str], cwd: str | None):
    """The Ray task (a generator): say it started, run the call sandboxed on this node, yield
    its result as plain data. The sandbox level and the hidden paths are the driver's."""
    yield STARTED
    from evotrainer import sandbox
    from evotrainer.executors.worker import run_named, use_isolation
    use_isolation(level)  # `namespaces` where this node cannot: refused, the job is a crash
    sandbox.conceal(*concealed)
    (res,) = run_named([NamedCall(**call)], 1, timeout_s=timeout_s + GRACE_S, memory_mb=memory_mb,
                       cwd=Path(cwd) if cwd and os.path.isdir(cwd) else None, threads=threads)
    yield dataclasses.asdict(res)


@functools.cache
def _remote():
    """The task, made a Ray remote function once per process (`run` names it evotrainer_job:
    the title its Ray worker process carries while it runs)."""
    import ray
    return ray.remote(_job)


def connect(address: str, num_cpus: int | None = None) -> None:
    """Join (or start) the Ray cluster once per process; a process where Ray already runs
    (a notebook, a test session, a Ray job) keeps its own."""
    import ray
    if ray.is_initialized():
        return
    kw = dict(num_cpus=num_cpus or os.cpu_count(), include_dashboard=False) if address == "local" else {}
    if address not in ("local", "auto"):  # Ray waits minutes on an address where nothing listens
        host, _, port = address.removeprefix("ray://").rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
        except OSError as e:
            raise UsageError(f"executor ray: nothing answers at '{address}' ({e.strerror or e}); start the head "
                             "node with `ray start --head`, or set ray.address") from None
    try:  # log_to_driver off: our stdout is one JSON line; a job's output is in its log tail
        ray.init(address=address, namespace="evotrainer", log_to_driver=False, **kw)
    except (ConnectionError, RuntimeError, ValueError) as e:
        hint = "" if address in ("local", "auto") else (
            "; a cluster with token authentication needs RAY_AUTH_MODE=token and its token (RAY_AUTH_TOKEN or "
            "~/.ray/auth_token) when it is named by address")
        raise UsageError(f"executor ray: cannot reach the Ray cluster at '{address}': {_line(e)}{hint}") from None


@dataclass(frozen=True)
class RayExecutor(Executor):
    """Every call a Ray task; see the module docstring. `num_gpus` None: `processes` GPUs per
    job (the run's data_parallel, all on one node) where `device` names CUDA, or where it is
    `auto` and the cluster has GPUs; else none."""
    address: str = "local"
    num_cpus: float = 1.0
    num_gpus: float | None = None
    memory_mb: int = 0
    retries: int = 2
    device: str = "auto"
    processes: int = 1
    cwd: Path | None = None

    def start(self) -> None:
        connect(self.address)
        self.options()

    def threads(self, batch: int) -> int:
        return max(1, int(self.num_cpus))

    def run(self, calls: list[Call], timeout_s: float, memory_mb: int | None = 8192,
            on_poll: Callable[[], None] | None = None) -> list[WorkerResult]:
        if not calls:
            return []
        import ray
        from evotrainer import sandbox
        from evotrainer.executors.worker import isolation
        connect(self.address)
        options = self.options()
        task = _remote().options(name="evotrainer_job", num_returns="streaming", max_retries=0, **options)
        args = dict(timeout_s=timeout_s, memory_mb=memory_mb, threads=self.threads(len(calls)),
                    level=isolation().value, concealed=sorted(sandbox.concealed()), cwd=str(self.cwd or Path.cwd()))
        results: list[WorkerResult | None] = [None] * len(calls)
        attempts = [0] * len(calls)
        live: dict = {}  # generator -> [call index, when it started (None: queued), seconds at submit]

        def submit(i: int) -> None:
            attempts[i] += 1
            # plain data, the target by name: this node imports it, in the job's worker only
            live[task.remote(dataclasses.asdict(calls[i].named()), **args)] = [i, None, time.monotonic()]

        for i in range(len(calls)):
            submit(i)
        try:
            while live:
                ready, _ = ray.wait(list(live), num_returns=len(live), timeout=0.1)
                for gen in ready:
                    i, started, t0 = live[gen]
                    try:
                        value = ray.get(next(gen))
                    except StopIteration:
                        value = None
                    except ray.exceptions.RayError as e:
                        del live[gen]
                        res = self._failed(e, attempts[i], time.monotonic() - t0)
                        if res is None:
                            submit(i)
                        else:
                            results[i] = res
                        continue
                    if value == STARTED:
                        live[gen][1] = time.monotonic()
                        continue
                    del live[gen]
                    results[i] = WorkerResult(**value) if isinstance(value, dict) else WorkerResult(
                        "crash", error="the Ray task ended without a result", seconds=time.monotonic() - t0)
                now = time.monotonic()
                late = [gen for gen, (_, started, _) in live.items() if started is not None and now - started > timeout_s]
                _cancel(late)
                for gen in late:
                    i, _, t0 = live.pop(gen)
                    results[i] = WorkerResult("timeout", error=f"killed after {timeout_s:g} s (cancelled with "
                                              "force on its Ray node)", seconds=now - t0)
                if on_poll:
                    on_poll()
        finally:  # the caller died or was interrupted: no job outlives it
            _cancel(list(live))
            for i, _, t0 in live.values():
                results[i] = WorkerResult("crash", error="stopped: the caller was interrupted",
                                          seconds=time.monotonic() - t0)
            if on_poll:
                on_poll()
        return results

    def _failed(self, e: Exception, attempt: int, seconds: float) -> WorkerResult | None:
        """A task that raised: None to run it again (lost with its worker or node, attempts
        left), else its labelled result."""
        import ray
        lost = (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError, ray.exceptions.ObjectLostError,
                ray.exceptions.LocalRayletDiedError)
        if isinstance(e, ray.exceptions.OutOfMemoryError):  # Ray's memory monitor killed it
            return WorkerResult("oom", error=_line(e), seconds=seconds)
        if isinstance(e, lost):
            if attempt <= self.retries:
                return None
            return WorkerResult("crash", error=f"lost with its Ray worker or node {attempt} time(s), "
                                f"no retries left: {_line(e)}", seconds=seconds)
        cause = e.cause if isinstance(e, ray.exceptions.RayTaskError) and e.cause is not None else e
        return WorkerResult("crash", error=f"{type(cause).__name__}: {_line(cause)}", log_tail=str(e)[-4000:],
                            seconds=seconds)

    def options(self) -> dict:
        """What each task asks Ray for, checked against the cluster's nodes: a request that no
        node can hold would wait forever, so it is one clear error instead."""
        import ray
        gpus = self.num_gpus
        if gpus is None:
            cuda = self.device.startswith("cuda") or (self.device == "auto" and ray.cluster_resources().get("GPU", 0) > 0)
            gpus = float(self.processes) if cuda else 0.0
        want = {"CPU": self.num_cpus, "GPU": gpus, "memory": self.memory_mb * 2**20}
        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        if not any(all(n.get(k, 0) >= v for k, v in want.items() if v) for n in nodes):
            have = "; ".join(", ".join(f"{k} {v:g}" for k, v in sorted(n.items()) if k in want) for n in nodes)
            raise UsageError(f"executor ray: no node can hold a job of {self.num_cpus:g} CPU, {gpus:g} GPU"
                             f"{f', {self.memory_mb} MB' if self.memory_mb else ''} (nodes: {have or 'none'}); "
                             "lower ray.num_cpus / ray.num_gpus / ray.memory_mb")
        return {"num_cpus": self.num_cpus, "num_gpus": gpus, **({"memory": want["memory"]} if self.memory_mb else {})}


def _cancel(gens: list) -> None:
    """Cancel with force, then wait (bounded) until Ray says so for each: their workers, and
    the sandboxed jobs that die with them, are gone when this returns."""
    import ray
    for gen in gens:
        ray.cancel(gen, force=True)
    deadline = time.monotonic() + CANCEL_WAIT_S
    for gen in gens:
        while time.monotonic() < deadline:
            try:
                ray.get(next(gen), timeout=max(0.1, deadline - time.monotonic()))
            except (StopIteration, ray.exceptions.RayError):  # TaskCancelledError, or the worker died first
                break


def _line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]

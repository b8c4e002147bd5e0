"""Who trains a segment: a registry of backends, each a `run` function and the list of what
it cannot express.

    run(model, tok, task, harness, *, seed, steps, log, optimizer_state, runtime, sample_seed, world) -> optimizer_state
    (`seed` draws the data: problems and curriculum levels; `sample_seed` the rollouts' sampling)

trains `steps` steps on the model in place, records each through `log` (SegmentLog) and
returns AdamW's state for the next segment. `refusals(knobs, runtime)` names, one line
each, what a harness asks for that the backend cannot do; the controller and the `train`
command check it before any work, so nothing is silently approximated.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from evotrainer.errors import UsageError, unknown
from evotrainer.trainer.trl_mapping import trl_refusals


@dataclass(frozen=True)
class Backend:
    name: str
    run: Callable[..., dict]                     # the signature above; called in the worker that trains
    refusals: Callable[..., list[str]]            # (knobs, runtime) -> what it cannot express
    multi_turn: str = ""                         # why it cannot play environments; "" where it can


# The registry is read before any work, by processes that never train (the controller and the
# `train` command check a harness against it): each backend's trainer is imported inside its
# entry point, in the worker, and TRL (seconds to import) only where a segment trains with it.

def run_embedded(model, tok, task, harness, *, seed: int, steps: int, log, optimizer_state: dict | None,
                 runtime, sample_seed: int | None = None, world=None) -> dict:
    from evotrainer.trainer.grpo import GRPOTrainer
    from evotrainer.trainer.logprobs import enable_checkpointing
    if runtime.gradient_checkpointing:
        enable_checkpointing(model)
    trainer = GRPOTrainer(model, tok, task, harness, seed=seed, policy=runtime.policy,
                          micro_batch_size=runtime.micro_batch_size, sample_seed=sample_seed, world=world)
    if optimizer_state is not None:
        trainer.resume_optimizer(optimizer_state)
    for _ in range(steps):
        m, recs = trainer.step()
        if log is not None:  # (a data-parallel rank past the first records nothing)
            log.record(m.to_dict(), recs, model, tok)
    return trainer.optimizer_state()


def run_trl(model, tok, task, harness, *, seed: int, steps: int, log, optimizer_state: dict | None,
            runtime, sample_seed: int | None = None, world=None) -> dict:
    from evotrainer.trainer.trl_backend import run_trl as train_with_trl
    return train_with_trl(model, tok, task, harness, seed=seed, steps=steps, log=log, optimizer_state=optimizer_state,
                          runtime=runtime, sample_seed=sample_seed, world=world)


BACKENDS = {
    "embedded": Backend("embedded", run_embedded, lambda knobs, runtime: []),
    # TRL's multi-turn path (`environment_factory`, `max_tool_calling_iterations`) parses tool
    # calls with the model's chat template and holds its own environment objects: not yet
    # wired to ours (caps, traces, the harness's action parser), so it is refused, not half-run
    "trl": Backend("trl", run_trl, trl_refusals,
                   multi_turn="TRL's environment_factory is not wired to evotrainer environments yet "
                              "(caps, traces and the action_parser slot); use backend: embedded"),
}


def get_backend(name: str) -> Backend:
    if name not in BACKENDS:
        raise unknown("backend", name, BACKENDS)
    return BACKENDS[name]


def check_backend(runtime, knobs, harness: str = "the harness", task=None) -> None:
    """One line, before any work, if the backend cannot train this harness (on this task) as it is written."""
    from evotrainer.envs import EnvTask
    backend = get_backend(runtime.backend)
    if isinstance(task, EnvTask) and backend.multi_turn:
        raise UsageError(f"backend {runtime.backend} cannot train the multi-turn task {task.name}: {backend.multi_turn}")
    if isinstance(task, EnvTask) and runtime.data_parallel > 1:
        raise UsageError(f"data_parallel {runtime.data_parallel} cannot train the multi-turn task {task.name} yet "
                         "(its episodes are not gathered across processes); use data_parallel: 1")
    refused = backend.refusals(knobs, runtime)
    if refused:
        raise UsageError(f"backend {runtime.backend} cannot train {harness}: {refused[0]}")

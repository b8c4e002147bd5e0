"""A run's set-up, done once and found again on every resume: its config copy, its harness
repository, its base checkpoint and the split key of its held-out problems.

Each piece is built aside and renamed, or recorded in the lineage (`run_started`) before
anything relies on it, so a controller killed during set-up finds either the whole piece or
none of it.
"""
from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path

import yaml

from evotrainer.config import RunConfig
from evotrainer.errors import UsageError
from evotrainer.harness.versions import HarnessRepo
from evotrainer.lineage.events import RunStarted
from evotrainer.runtime import Runtime
from evotrainer.sandbox import conceal
from evotrainer.tasks.base import Task
from evotrainer.tasks.keys import key_digest, key_dir, split_key
from evotrainer.evolve.notices import BasePlan, OnEvent


def save_config(run_dir: Path, cfg: RunConfig) -> None:
    cfg_file = run_dir / "config.yaml"
    if not cfg_file.exists():  # written aside and renamed: resume always finds a whole config
        tmp = cfg_file.with_suffix(".yaml.tmp")
        tmp.write_text(yaml.safe_dump(_plain(dataclasses.asdict(cfg)), sort_keys=False))
        tmp.rename(cfg_file)


def open_repo(run_dir: Path, root: Path) -> HarnessRepo:
    """The run's harness repository, `root` as its v0."""
    repo_dir = run_dir / "harness-repo"
    if not repo_dir.exists():  # built aside and renamed: a kill never leaves half a repo
        tmp = run_dir / "harness-repo.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        HarnessRepo.init(tmp, root)
        tmp.rename(repo_dir)
    return HarnessRepo(repo_dir)


def first_start(cfg: RunConfig, task: Task, runtime: Runtime, *, model: str | None, max_depth: int,
                on_event: OnEvent) -> RunStarted:
    """The base built (or the user's model taken) and the task keyed: the run's `run_started`."""
    t = time.time()
    base = base_checkpoint(cfg, task, model, on_event)
    pol = runtime.policy
    device = f"{pol.resolved_device()}, {str(pol.compute_dtype()).removeprefix('torch.')}" \
        if cfg.executor == "local" else f"device {pol.device}, dtype {pol.dtype}, on the Ray cluster's nodes"
    return RunStarted(base=base, base_s=round(time.time() - t, 2), max_depth=max_depth, task=task.spec,
                      runtime=runtime.to_dict(), split_key=key_name(base, model, task),
                      split_key_digest=key_digest(task.key), device=device, executor=cfg.executor)


def key_name(base: str, model: str | None, task: Task) -> str:
    """Whose split key this run uses: a built base's (pretrain keyed the task already), or
    the user's model's with this task."""
    return Path(base).name if model is None else f"model:{base}|{task.name}/{task.target_level}"


def use_key(task: Task, started: RunStarted) -> None:
    """Key the task's held-out pool (the same key on a resume, or the run stops: new
    validation and test problems mid-run would void every comparison), and hide the
    keys and the task's data files from every job."""
    if started.split_key is None:  # a run from before split keys: its public split goes on
        return
    task.use_key(split_key(started.split_key))
    if key_digest(task.key) != started.split_key_digest:
        raise UsageError(f"this run's split key ({key_dir()}) is gone: resuming would change its validation "
                         f"and test problems; restore the key file or start a new run")
    conceal(key_dir(), *task.data_files())


def base_checkpoint(cfg: RunConfig, task: Task, model: str | None, on_event: OnEvent) -> str:
    if model:  # absolute: a resume may start from another directory
        task.use_key(split_key(key_name(model, model, task)))
        return model
    from evotrainer.trainer.pretrain import announce, pretrain, stages_to_build
    b = cfg.base
    stages = stages_to_build(task, b.pretrain_config())
    if stages:
        on_event(BasePlan(announce(stages)))
    path, _ = pretrain(task, b.pretrain_config(), require_target=b.require_target, progress=on_event)
    return str(path)


def _plain(x):
    """Tuples as lists, so the config copy is plain YAML."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x

"""One entry point: `evotrainer pretrain | train`.

Bad input (unknown task or slot, malformed knobs, missing checkpoint) prints one line
naming the problem and the valid choices and exits with code 2, without a traceback.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from evotrainer.errors import UsageError


class RunFailed(Exception):
    """Work that started and failed; the message names the label and where the log is."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse's own prints the usage block too)
        raise UsageError(message)


def _progress():
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TextColumn("{task.fields[info]}"),
                    console=Console(stderr=True), transient=False)


def _task(args):
    from evotrainer.tasks import get_task
    return get_task(args.task, args.level)


def _base(args, task):
    from evotrainer.pretrain import PretrainConfig, pretrain
    if args.base:
        from evotrainer.policy import load_policy
        load_policy(args.base)  # fail early, with the one-line error, if it is not a checkpoint
        return Path(args.base), None
    cfg = PretrainConfig(target_acc=args.target_acc)
    with _progress() as prog:
        bar = prog.add_task("pretrain base", total=cfg.max_steps, info="")
        path, meta = pretrain(task, cfg, args.cache_dir,
                              progress=lambda s, loss, acc: prog.update(
                                  bar, completed=s, info=f"loss {loss:.3f} probe acc {acc:.2f}"))
        prog.update(bar, completed=meta["steps"], total=meta["steps"])
    return path, meta


def cmd_pretrain(args) -> dict:
    task = _task(args)
    path, meta = _base(args, task)
    return {"base": str(path), **{k: meta[k] for k in ("steps", "probe_acc", "seconds", "params")}}


def cmd_train(args) -> dict:
    from evotrainer.harness import inspect_harness
    from evotrainer.train import TrainingFailed, train_run
    task = _task(args)
    knobs = inspect_harness(args.harness)  # bad knobs or slot names fail here, before any work
    steps = knobs.steps if args.steps is None else args.steps
    if steps < 0:
        raise UsageError(f"--steps must be >= 0, got {steps}")
    base, _ = _base(args, task)
    with _progress() as prog:
        bar = prog.add_task(f"train {task.name} seed {args.seed}", total=steps, info="")

        def on_step(m: dict):
            prog.update(bar, completed=m["step"], info=f"reward {m['reward_mean']:.3f} "
                        f"score {m['score_mean']:.3f} dead {m['dead_groups']:.2f}")
        try:
            summary = train_run(task, args.harness, base, Path(args.out), seed=args.seed, steps=steps,
                                timeout_s=args.timeout, on_step=on_step)
        except TrainingFailed as e:
            raise RunFailed(str(e)) from None
    keys = ("task", "level", "seed", "steps", "base_val", "val", "base_test", "test", "seconds")
    return {k: summary[k] for k in keys} | {"out": str(args.out)}


def build_parser() -> argparse.ArgumentParser:
    from evotrainer.pretrain import DEFAULT_CACHE, PretrainConfig
    p = _Parser(prog="evotrainer", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def common(sp):
        sp.add_argument("--task", default="arith", help="arith (default) or rg:<reasoning-gym family>")
        sp.add_argument("--level", type=int, default=None, help="target difficulty (arith: digits, default 3)")
        sp.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help="where base checkpoints are cached")
        sp.add_argument("--base", type=Path, default=None, help="start from this checkpoint instead of the cached base")
        sp.add_argument("--target-acc", type=float, default=PretrainConfig().target_acc,
                        help="the cached base's SFT stops at this greedy accuracy on a train-stream probe")

    sp = sub.add_parser("pretrain", help="build (or reuse) the cached SFT base checkpoint")
    common(sp)
    sp.set_defaults(fn=cmd_pretrain)
    sp = sub.add_parser("train", help="train one harness from the base and evaluate it")
    common(sp)
    sp.add_argument("--harness", type=Path, default=None, help="harness directory (default: the reference)")
    sp.add_argument("--steps", type=int, default=None, help="training steps (default: the harness's knob)")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--out", type=Path, required=True)
    sp.add_argument("--timeout", type=float, default=3600.0, help="seconds before the training worker is killed")
    sp.set_defaults(fn=cmd_train)
    return p


def main(argv: list[str] | None = None) -> int:
    import transformers
    transformers.utils.logging.disable_progress_bar()  # our own progress bars say enough
    try:
        args = build_parser().parse_args(argv)
        result = args.fn(args)
    except UsageError as e:
        print(f"evotrainer: error: {e}", file=sys.stderr)
        return 2
    except RunFailed as e:  # the work ran and failed (a harness bug, a timeout): exit 1
        print(f"evotrainer: failed: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

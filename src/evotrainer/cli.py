"""RL of a language model that evolves its training harness as it trains (`evotrainer COMMAND --help`).

Bad input (unknown task or slot, malformed knobs, missing checkpoint) prints one line
naming the problem and the valid choices and exits with code 2, without a traceback.
Work that ran and failed, or a candidate that was rejected (illegal, backtest rejected,
crash, timeout, oom), exits with code 1 and one line saying why; the JSON result, where
there is one, still goes to stdout.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from pathlib import Path

from evotrainer.errors import HarnessFailed, UsageError
from evotrainer.jobfiles import BadOutput


class RunFailed(Exception):
    """Work that started and failed; the message names the label and where the log is."""


class Rejected(Exception):
    """A candidate judged and turned down: the result is printed, the exit code is 1."""

    def __init__(self, message: str, result: dict):
        super().__init__(message)
        self.result = result


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse's own prints the usage block too)
        raise UsageError(message)


def _progress(transient: bool = False):
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
                    console=Console(stderr=True), transient=transient)


def _task(args):
    from evotrainer.catalog import get_task
    return get_task(args.task, args.level)


def _base(args, task, cfg):
    """The base checkpoint: the user's model, or the built-in one SFT'd as the run config's `base` says."""
    from evotrainer.trainer.pretrain import announce, pretrain, stages_to_build
    if getattr(args, "model", None):
        from evotrainer.policy.model import resolve_model
        from evotrainer.tasks.keys import split_key
        path = Path(resolve_model(args.model))  # fails early, in one line, if it is no causal LM
        task.use_key(split_key(f"model:{path}|{task.name}/{task.target_level}", args.cache_dir))
        return path, None
    sft = cfg.base.pretrain_config()
    stages = stages_to_build(task, sft, args.cache_dir)
    if stages:  # said before SFT starts: what it builds, and how long that took when measured
        print(announce(stages), file=sys.stderr)
    with _progress() as prog:
        bars = {}

        def show(p):  # a bar per stage; its ETA follows this machine's pace
            if p.stage not in bars:
                bars[p.stage] = prog.add_task(f"SFT {p.stage}", total=p.total, info="")
            prog.update(bars[p.stage], completed=p.step, total=p.total,
                        info=f"loss {p.loss:.3f} probe {p.probe_acc:.2f} of {p.target:.2f}")
        path, meta = pretrain(task, sft, args.cache_dir, progress=show)
        for bar in bars.values():  # each stage stopped at its target: its bar full
            prog.update(bar, total=prog.tasks[bar].completed)
    return path, meta


def cmd_pretrain(args) -> dict:
    task = _task(args)
    path, meta = _base(args, task, _run_config(args))
    return {"base": str(path), **{k: meta[k] for k in ("steps", "probe_acc", "seconds", "params")}}


def _config_flags(sp, flags: dict[str, str | None]) -> None:
    """A flag per run-config key in `flags` (key -> the flag's name where it is not the key's
    own), its default, type, choices and help the key's field's (config.py): one source, so a
    flag cannot drift from the key it sets. A true-by-default switch is turned off by `--no-KEY`."""
    from evotrainer.config import key_field, optional, shown
    known = dict(sp.get_default("config_flags") or {})
    for key, flag in flags.items():
        f, hint = key_field(key)
        kind, _ = optional(hint)
        flag = flag or "--" + key.rpartition(".")[2].replace("_", "-")
        dest = flag[2:].replace("-", "_")
        text = f.metadata["help"].replace("%", "%%")  # argparse formats help with %
        if kind is bool and f.default:
            flag = "--no-" + flag[2:]
            sp.add_argument(flag, dest=dest, action="store_false", help=f"turn {key} off: {text}")
        elif kind is bool:
            sp.add_argument(flag, dest=dest, action="store_true", help=text)
        else:
            default = "" if f.default is None else f" (default: {shown(f.default)})"
            sp.add_argument(flag, dest=dest, type=kind, default=f.default, choices=f.metadata["choices"] or None,
                            help=text + default)
        known[dest] = (key, flag)
    sp.set_defaults(config_flags=known)


def _run_config(args):
    """The run config the command's flags spell, every other key at its default, checked as a
    config file is; a bad value is named by the flag the user typed."""
    from evotrainer.config import config_from_dict
    raw = {"task": args.task}
    for dest, (key, _) in args.config_flags.items():
        *sections, name = key.split(".")
        at = raw
        for s in sections:
            at = at.setdefault(s, {})
        at[name] = getattr(args, dest)
    if getattr(args, "lora_rank", None):  # a LoRA of rank R: alpha 2R, every other lora key at its default
        raw["lora"] = {"rank": args.lora_rank, "alpha": 2.0 * args.lora_rank}
    try:
        cfg = config_from_dict(raw)
        cfg.runtime().validate()  # its lines name the setting as the flags do ("device must be ...")
        return cfg.validate()
    except UsageError as e:
        msg = str(e)
        for key, flag in args.config_flags.values():
            msg = msg.replace(f"config: '{key}'", flag)
        raise UsageError(msg) from None


def cmd_train(args) -> dict:
    from evotrainer.harness import inspect_harness
    from evotrainer.trainer.backends import check_backend
    from evotrainer.trainer.run import TrainingFailed, train_run
    task = _task(args)
    cfg = _run_config(args)
    runtime = cfg.runtime()
    knobs = inspect_harness(args.harness)  # bad knobs or slot names fail here, before any work
    check_backend(runtime, knobs, str(args.harness or "the reference harness"), task)
    steps = knobs.steps if args.steps is None else args.steps
    if steps < 0:
        raise UsageError(f"--steps must be >= 0, got {steps}")
    base, _ = _base(args, task, cfg)  # keys the task's held-out pool (tasks/keys.py)
    from evotrainer.sandbox import conceal
    from evotrainer.tasks.keys import key_dir
    conceal(key_dir(args.cache_dir), *task.data_files())
    with _progress() as prog:
        bar = prog.add_task(f"train {task.name} seed {args.seed}", total=steps, info="")

        def on_step(m: dict):
            prog.update(bar, completed=m["step"], info=f"reward {m['reward_mean']:.3f} "
                        f"score {m['score_mean']:.3f} dead {m['dead_groups']:.2f}")
        try:
            summary = train_run(task, args.harness, base, Path(args.out), seed=args.seed, steps=steps,
                                timeout_s=args.timeout, on_step=on_step, runtime=runtime,
                                memory_mb=cfg.worker_memory_mb, eval_every=cfg.evaluation.every)
        except TrainingFailed as e:
            raise RunFailed(str(e)) from None
    keys = ("task", "level", "seed", "steps", "backend", "base_val", "val", "base_test", "test", "reward_first",
            "reward_last", "seconds")
    return {k: summary[k] for k in keys} | {"out": str(args.out)}


def cmd_evaluate(args) -> dict:
    """Greedy accuracy and pass@k of a checkpoint, in the evaluator's sandboxed process."""
    from evotrainer.evaluate.sampled import evaluate_sampled  # the job's target; deferred as every import here (torch)
    from evotrainer.executors import run_in_worker
    from evotrainer.policy.adapters import LoraSpec, is_adapter
    from evotrainer.policy.model import resolve_model
    task = _task(args)
    if args.split == "all" and not hasattr(task, "problems"):
        raise UsageError(f"--split all needs an evaluation set with a fixed list of problems (humaneval); "
                         f"{task.name} has val and test")
    if args.samples < 0 or any(k < 1 or k > max(args.samples, 1) for k in args.k):
        raise UsageError(f"--k values must be in 1..--samples ({args.samples}), got {args.k}")
    cfg = _run_config(args)
    key, started, policy = None, None, cfg.runtime().policy
    if args.run is not None:  # that run's held-out problems (its split key)
        from evotrainer.evolve.status import open_run
        from evotrainer.lineage.events import RunStarted
        from evotrainer.tasks.keys import split_key
        store = open_run(args.run)
        try:
            started = store.events(RunStarted)
        finally:
            store.close()
        if not started or started[0].split_key is None:
            raise UsageError(f"run '{args.run}' has no split key on record (not started, or older than split keys)")
        key = split_key(started[0].split_key).hex()
    if is_adapter(args.model):  # a LoRA run's checkpoint: its base and adapter spec are the run's
        lora = started and (started[0].runtime or {}).get("policy", {}).get("lora")
        if not lora:
            raise UsageError(f"'{args.model}' is a LoRA adapter: pass --run RUN, the LoRA run that trained it "
                             "(its base model and adapter spec are on record there)")
        policy = dataclasses.replace(policy, lora=dataclasses.replace(LoraSpec.of(lora), base=started[0].base))
        model = str(Path(args.model).resolve())
    else:
        model = str(resolve_model(args.model))
    r = run_in_worker(evaluate_sampled, dict(
        task=task.spec, level=task.target_level, checkpoint=model, split=args.split, samples=args.samples,
        ks=list(args.k), temperature=args.temperature, policy=policy.to_dict(), key=key),
        timeout_s=args.timeout, memory_mb=cfg.worker_memory_mb, reveal=task.data_files(),
        reads=(model, *task.files(), *task.data_files(), *policy.reads()))
    if not r.ok:
        raise RunFailed(f"evaluation {r.label}: {r.error}")
    return r.value


def cmd_diagnose(args) -> dict:
    from evotrainer.diagnostics.health import diagnose, write_reports
    reports = diagnose(args.dir, args.harness, timeout_s=args.timeout)
    js, md = write_reports(reports, args.out or args.dir)
    return {"json": str(js), "markdown": str(md), "versions": [{
        "source": r["source"], "worst": r["worst"], "blocking": r["blocking"],
        "findings": [f"{f['severity']}: {f['diagnostic']} = {f['value']:g}" for f in r["findings"]]}
        for r in reports]}


def cmd_backtest(args) -> dict:
    from evotrainer.backtest import BacktestConfig, backtest
    from evotrainer.backtest.run import to_markdown
    try:
        cfg = BacktestConfig(max_violation_rate=args.max_violation_rate,
                             max_graded_violation_rate=args.max_graded_violation_rate).validate()
    except ValueError as e:
        raise UsageError(str(e)) from None
    outcome = backtest(args.evidence, args.harness, args.parent, cfg, timeout_s=args.timeout)
    md = to_markdown(outcome, args.evidence, args.harness)
    result = {"label": outcome.label, "reasons": outcome.reasons}
    if outcome.report:
        r = outcome.report
        result |= {k: getattr(r, k) for k in (
            "ordering_violations", "pairs_compared", "graded_violations", "graded_pairs", "correct_cut_by_truncation", "dead_group_ratio_before",
            "dead_group_ratio_after", "reward_score_spearman_after", "off_score_signal_after", "off_score_tracks")}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "backtest.json").write_text(json.dumps(outcome.to_dict(), indent=2))
        (args.out / "backtest.md").write_text(md)
        result["markdown"] = str(args.out / "backtest.md")
    print(md, file=sys.stderr)
    if not outcome.passed:
        raise Rejected(f"{outcome.label}: {'; '.join(outcome.reasons)}", result)
    return result


def cmd_replay(args) -> dict:
    from evotrainer.diagnostics.replay import replay
    labelled = []
    for item in args.versions:
        d, sep, label = item.rpartition("=")
        if not sep or not d:
            raise UsageError(f"'{item}' is not DIR=LABEL (for example runs/v3=invalid)")
        labelled.append((Path(d), label))
    return replay(args.diagnostic, labelled, args.harness, args.min_auc, timeout_s=args.timeout).to_dict()


def _sft_line(e) -> str:
    """A line of the base's build (an SftProgress), for output that is not a terminal."""
    return (f"building the base, {e.stage}: SFT step {e.step}, loss {e.loss:.3f}, "
            f"probe accuracy {e.probe_acc:.2f} of {e.target:.2f}")


def _run_loop(cfg, out: Path) -> dict:
    from evotrainer.backtest.measured import verdict_note
    from evotrainer.evolve.controller import ControlFailed, Controller
    from evotrainer.evolve.notices import BasePlan, Stage
    from evotrainer.evolve.segments.progress import Progress
    from evotrainer.evolve.status import status
    from evotrainer.lineage import TrialRecord
    from evotrainer.lineage.events import (
        ApprovalDecided,
        ApprovalWaiting,
        Escalated,
        FinalFinished,
        FinalStarted,
        Stopped,
        TrackerFailed,
        TrialResumed,
        TrialStarted,
    )
    from evotrainer.live import LiveDisplay
    from evotrainer.trainer.pretrain import SftProgress
    view = LiveDisplay()
    say = view.say

    def show(e):
        if isinstance(e, Stage):
            view.set_stage(e.text)
        elif isinstance(e, Progress):
            view.training(e.title, e.jobs)
        elif isinstance(e, BasePlan):
            say(e.text)
        elif isinstance(e, SftProgress):
            if not view.console.is_terminal and e.step % 100 == 0:  # a log has no live bar
                say(_sft_line(e))
            # steps of the SFT stage under way, against what it took when measured
            view.set_stage("building the base (SFT, cached afterwards)")
            view.training("base", [(e.stage, e.step, e.total, f"loss {e.loss:.3f} probe {e.probe_acc:.2f}")],
                          lines=False)
        elif isinstance(e, TrialRecord):
            mean = f" val {e.fitness.mean_val:.3f}" if e.fitness.val else ""
            why = f" ({verdict_note(e.label)})" if e.label == "backtest_rejected" else ""
            say(f"trial {e.id} {e.version} [{e.intervention}]: {e.label}{mean}{why}")
        elif isinstance(e, TrialStarted):
            say(f"trial {e.trial} started: {e.intervention}" + (f" from {e.plan.parent.version}" if e.plan else ""))
        elif isinstance(e, (Stopped, TrialResumed, Escalated, TrackerFailed)):
            say(f"{e.KIND.replace('_', ' ')}: {', '.join(f'{k} {v}' for k, v in e.to_json().items())}")
        elif isinstance(e, FinalStarted):
            say(f"final comparison: winner {e.winner} (schedule {' -> '.join(e.schedule)}) "
                f"and the reference, retrained from the base on fresh seeds {e.seeds}")
        elif isinstance(e, FinalFinished):
            say(e.table)
        elif isinstance(e, ApprovalWaiting):
            view.set_stage(f"trial {e.trial} waits for approval at {e.point}")
            say(f"trial {e.trial} waits for approval at {e.point}: {e.intervention}: {e.hypothesis}\n"
                f"  decide with: evotrainer approve {out} {e.trial} | evotrainer revise {out} {e.trial} "
                f"--feedback TEXT | evotrainer abort {out} {e.trial}")
        elif isinstance(e, ApprovalDecided):
            say(f"trial {e.trial} {e.point} approval: {e.decision} {e.feedback}")
    try:
        with view:
            Controller(cfg, out, on_event=show).run()
    except ControlFailed as e:
        raise RunFailed(str(e)) from None
    return status(out)


def cmd_run(args) -> dict:
    import dataclasses

    from evotrainer.config import load_config
    cfg = load_config(args.config)  # every key checked before any work
    if args.model:
        cfg = dataclasses.replace(cfg, model=args.model)
    if (args.out / "lineage.sqlite").exists():
        raise UsageError(f"'{args.out}' already holds a run; continue it with `evotrainer resume {args.out}`")
    st = _run_loop(cfg, args.out)
    return st if args.json else None


def cmd_screen(args) -> dict:
    """Every single change from the root harness, on the user's task and seeds, each trained
    from the base (evolve/landscape.py): what a careful engineer runs before tuning."""
    import dataclasses

    from evotrainer.config import load_config
    from evotrainer.evolve.landscape import screen
    from evotrainer.evolve.notices import BasePlan
    from evotrainer.trainer.pretrain import SftProgress
    cfg = load_config(args.config)
    if len(cfg.seeds) < 2:
        raise UsageError(f"a screen needs at least 2 seeds for its intervals (the config's seeds: {cfg.seeds})")
    if args.model:
        cfg = dataclasses.replace(cfg, model=args.model)
    def base(e):  # where the config's base is not cached yet: its build, a line per 100 SFT steps
        if isinstance(e, BasePlan) or (isinstance(e, SftProgress) and e.step % 100 == 0):
            print(e.text if isinstance(e, BasePlan) else _sft_line(e), file=sys.stderr, flush=True)
    rows, table = screen(cfg, args.out, args.moves, lambda r: print(
        f"  {r.name}: " + (f"val {100 * sum(r.val.values()) / len(r.val):.1f}%" if r.val else r.failed),
        file=sys.stderr, flush=True), on_event=base)
    from evotrainer.report import write_report
    page = write_report(args.out)["report"]
    print(f"{table}\n\nreport: {page}", file=sys.stderr)
    return {n: {"val": r.val, "test": r.test, "failed": r.failed} for n, r in rows.items()} if args.json else None


def cmd_resume(args) -> dict:
    from evotrainer.config import load_config
    from evotrainer.evolve.status import open_run
    open_run(args.run).close()
    st = _run_loop(load_config(args.run / "config.yaml"), args.run)
    return st if args.json else None


def cmd_status(args) -> dict:
    from evotrainer.evolve.status import status
    st = status(args.run)
    if args.json:
        return st
    revisions = st.pop("controller_revisions", [])  # one line each, below
    print("\n".join(f"{k}: {v}" for k, v in st.items()), file=sys.stderr)
    for r in revisions:
        print(f"controller r{r['revision']} after trial {r['after']}: {'; '.join(r['changes'])} (because "
              f"{r['reason']}; cites trials {', '.join(map(str, r['cites']))})", file=sys.stderr)
    if (args.run / "final.md").exists():
        print((args.run / "final.md").read_text(), file=sys.stderr)
    return None


def cmd_decide(args) -> dict:
    """approve / revise / abort: the decision a trial waits for at an approval point."""
    from evotrainer.evolve.approval import submit
    from evotrainer.evolve.status import open_run
    store = open_run(args.run)
    try:
        events = store.events()
    finally:
        store.close()
    return submit(args.run, events, args.trial, args.command, getattr(args, "feedback", "") or "")


def cmd_lineage(args) -> dict:
    from evotrainer.evolve.status import lineage_tree
    tree = lineage_tree(args.run)
    print(tree, file=sys.stderr)
    return None


def cmd_report(args) -> dict:
    from evotrainer.evolve.status import open_run
    from evotrainer.report import write_report
    from evotrainer.report.write import is_screen
    if not (args.run / "evidence.jsonl").is_file() and not is_screen(args.run):  # each has its own report
        open_run(args.run).close()  # none of the three: one line, exit 2
    return write_report(args.run, args.out, args.engine)


def _library(args):
    from evotrainer.config import DEFAULT_SKILLS
    from evotrainer.skills import SkillLibrary
    path = Path(args.library or DEFAULT_SKILLS).expanduser()
    if not path.is_file():
        raise UsageError(f"no skill library at '{path}' (runs write one at search.skills; pass --library PATH)")
    return SkillLibrary(path)


def cmd_skills_list(args) -> dict:
    lib = _library(args)
    skills = lib.skills()
    lib.close()
    rows = [f"{'skill':55} {'tried':>5} {'kept':>4} {'invalid':>7} {'mean gain':>9} {'score':>7}  held on"]
    for sk in sorted(skills, key=lambda x: -x.score):
        gain = f"{100 * sk.mean_gain:+.1f}" if sk.mean_gain is not None else "-"
        rows.append(f"{sk.name:55} {sk.tried:5d} {sk.kept:4d} {sk.invalid:7d} {gain:>9} {100 * sk.score:+7.2f}  "
                    f"{', '.join(sk.held_on) or '-'}{' (general)' if sk.general else ''}")
    print("\n".join(rows), file=sys.stderr)
    return {"skills": len(skills)}


def cmd_skills_show(args) -> dict:
    import dataclasses
    lib = _library(args)
    sk = lib.get(args.name)
    names = [x.name for x in lib.skills()]
    lib.close()
    if sk is None:
        raise UsageError(f"unknown skill '{args.name}'; valid choices: {', '.join(names) or 'none yet'}")
    return dataclasses.asdict(sk) | {"general": sk.general, "score": sk.score}


def build_parser() -> argparse.ArgumentParser:
    from evotrainer.trainer.pretrain import DEFAULT_CACHE
    p = _Parser(prog="evotrainer", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def common(sp):
        sp.add_argument("--task", default="arith",
                        help="task spec: arith (default), rg:<reasoning-gym family>, jsonl:PATH[?verifier=exact|numeric|"
                             "math], package.module:Factory, file.py:Factory, or an evotrainer.tasks entry point")
        sp.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help="where base checkpoints are cached")
        _config_flags(sp, {"level": None, "base.target_acc": None, "base.seed": "--base-seed", "base.warm_start": None})

    sp = sub.add_parser("pretrain", help="build (or reuse) the cached SFT base checkpoint")
    common(sp)
    sp.set_defaults(fn=cmd_pretrain)
    sp = sub.add_parser("train", help="train one harness from the base and evaluate it")
    common(sp)
    sp.add_argument("--model", default=None, help="any Hugging Face causal LM (a directory, or a hub id in the "
                    "local cache), or a checkpoint of ours (default: the built-in tiny model's cached SFT base)")
    # the run config's keys, spelled as flags; --memory-mb and --eval-every kept their short names
    _config_flags(sp, {"backend": None, "dtype": None, "weights": None, "gradient_checkpointing": None,
                       "data_parallel": None, "device": None, "chat_template": None, "micro_batch_size": None,
                       "worker_memory_mb": "--memory-mb", "evaluation.every": "--eval-every"})
    # the lora section in one number (its default, None, is the key's: full fine-tuning)
    sp.add_argument("--lora-rank", type=int, default=None, metavar="R", help="train LoRA adapters of rank R "
                    "(alpha 2R, every linear layer; 0: full fine-tuning); pip install 'evotrainer[peft]'")
    sp.add_argument("--harness", type=Path, default=None, help="harness directory (default: the reference)")
    sp.add_argument("--steps", type=int, default=None, help="training steps (default: the harness's knob)")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--out", type=Path, required=True)
    sp.add_argument("--timeout", type=float, default=3600.0, help="seconds before the training worker is killed")
    sp.set_defaults(fn=cmd_train)

    sp = sub.add_parser("evaluate", help="greedy accuracy and pass@k of a checkpoint on a task's split")
    sp.add_argument("--task", default="arith", help="task spec (codegen, humaneval, arith, rg:FAMILY, jsonl:PATH, ...)")
    sp.add_argument("--model", required=True, help="checkpoint directory, or any Hugging Face causal LM")
    sp.add_argument("--split", default="test", choices=("val", "test", "all"),
                    help="which problems ('all': every problem of an evaluation set such as humaneval)")
    sp.add_argument("--samples", type=int, default=0, help="completions per problem for pass@k (0: greedy only)")
    sp.add_argument("--k", type=int, nargs="+", default=[1], help="pass@k for these k (each <= --samples)")
    sp.add_argument("--temperature", type=float, default=0.8, help="sampling temperature for pass@k")
    sp.add_argument("--run", type=Path, default=None, help="use this run's held-out problems (its split key); "
                    "without it, the public split of the task")
    _config_flags(sp, {"level": None, "dtype": None, "device": None, "chat_template": None,
                       "worker_memory_mb": "--memory-mb"})
    sp.add_argument("--timeout", type=float, default=3600.0, help="seconds before the evaluator is stopped")
    sp.set_defaults(fn=cmd_evaluate)
    sp = sub.add_parser("diagnose", help="health report (health.md, health.json) of a train or run directory")
    sp.add_argument("dir", type=Path, help="a train directory, or a directory of them (one per version)")
    sp.add_argument("--harness", type=Path, default=None,
                    help="whose diagnostics to run (default: the harness each train directory kept)")
    sp.add_argument("--out", type=Path, default=None, help="where to write the report (default: DIR)")
    sp.add_argument("--timeout", type=float, default=600.0, help="seconds before a harness's diagnostics are killed")
    sp.set_defaults(fn=cmd_diagnose)

    sp = sub.add_parser("backtest", help="judge a candidate harness on cached rollouts, before training it")
    sp.add_argument("--evidence", type=Path, required=True, help="train directory whose rollouts to re-score")
    sp.add_argument("--harness", type=Path, required=True, help="the candidate harness directory")
    sp.add_argument("--parent", type=Path, default=None,
                    help="parent harness for the legality check (default: the evidence's own harness)")
    sp.add_argument("--max-violation-rate", type=float, default=0.0,
                    help="share of same-group pairs with a correct rollout in which the candidate pays the wrong one more")
    sp.add_argument("--max-graded-violation-rate", type=float, default=1.0,
                    help="share of pairs of differently graded wrong answers the candidate may order the other way "
                         "(1, the default: reported, never rejected)")
    sp.add_argument("--out", type=Path, default=None, help="write backtest.json and backtest.md here")
    sp.add_argument("--timeout", type=float, default=600.0, help="seconds before the candidate's code is killed")
    sp.set_defaults(fn=cmd_backtest)

    sp = sub.add_parser("replay", help="replay a diagnostic over labelled versions; keep it if it separates them")
    sp.add_argument("versions", nargs="+", metavar="DIR=LABEL",
                    help="train directory and its outcome: kept (held up) or discarded, invalid, crash, timeout, oom")
    sp.add_argument("--diagnostic", required=True, help="diagnostic name (built in, or from --harness)")
    sp.add_argument("--harness", type=Path, default=None, help="harness whose diagnostics.py defines or revises it")
    sp.add_argument("--min-auc", type=float, default=0.8, help="separation needed to keep the diagnostic")
    sp.add_argument("--timeout", type=float, default=600.0)
    sp.set_defaults(fn=cmd_replay)

    sp = sub.add_parser("run", help="evolve the harness with the policy, as the run config says")
    sp.add_argument("config", type=Path, help="run config (YAML)")
    sp.add_argument("--model", default=None, help="the config's `model`: any Hugging Face causal LM directory")
    sp.add_argument("--out", type=Path, required=True, help="the run directory (lineage, versions, evidence)")
    sp.add_argument("--json", action="store_true", help="print the run's status as one JSON line on stdout at the end")
    sp.set_defaults(fn=cmd_run)
    sp = sub.add_parser("screen", help="every single change from the root harness, each trained from the base on "
                        "the config's seeds: gains over the root with 95%% intervals (OUT/screen.md)")
    sp.add_argument("config", type=Path, help="run config (YAML): its task, model, root harness, steps and seeds")
    sp.add_argument("--out", type=Path, required=True, help="the screen's directory (run it again to go on)")
    sp.add_argument("--moves", default="catalog", help="catalog: the named, literature-backed changes; all: the "
                    "search space's too; or move names, comma-separated (lower_lr,partial_credit)")
    sp.add_argument("--model", default=None, help="the config's `model`: any Hugging Face causal LM directory")
    sp.add_argument("--json", action="store_true", help="print every row as one JSON line on stdout at the end")
    sp.set_defaults(fn=cmd_screen)
    sp = sub.add_parser("resume", help="continue a run that was stopped or killed")
    sp.add_argument("run", type=Path)
    sp.add_argument("--json", action="store_true", help="print the run's status as one JSON line on stdout at the end")
    sp.set_defaults(fn=cmd_resume)
    sp = sub.add_parser("status", help="trials, labels, best version and time spent of a run")
    sp.add_argument("run", type=Path)
    sp.add_argument("--json", action="store_true", help="one JSON line on stdout instead of the text")
    sp.set_defaults(fn=cmd_status)
    for name, what in (("approve", "go on with the trial waiting at an approval point"),
                       ("revise", "send the proposal back to the agent with feedback (same trial)"),
                       ("abort", "end the trial waiting at an approval point, labelled aborted; the run goes on")):
        sp = sub.add_parser(name, help=what)
        sp.add_argument("run", type=Path)
        sp.add_argument("trial", type=int)
        if name == "revise":
            sp.add_argument("--feedback", required=True, help="what the agent should change")
        sp.set_defaults(fn=cmd_decide)
    sp = sub.add_parser("lineage", help="the version tree of a run, with labels and fitness")
    sp.add_argument("run", type=Path)
    sp.set_defaults(fn=cmd_lineage)
    sp = sub.add_parser("report", help="one self-contained HTML file of a run (finished or in progress), of a "
                        "train directory (yours, or another trainer's rollouts) or of a screen; opens offline")
    sp.add_argument("run", type=Path, help="a run directory, a directory holding evidence.jsonl, or a screen's")
    sp.add_argument("--out", type=Path, default=None, help="the HTML file (default: RUN/report.html)")
    sp.add_argument("--engine", default="auto", help="charts: plotly (interactive; the `report` extra), svg (static, "
                    "no script) or auto (plotly where installed)")
    sp.set_defaults(fn=cmd_report)
    sk = sub.add_parser("skills", help="the skill library: validated interventions shared by runs").add_subparsers(
        dest="skills_cmd", required=True, metavar="{list,show}")
    sp = sk.add_parser("list", help="every skill with its counts, mean gain and the tasks where it held")
    sp.add_argument("--library", type=Path, default=None, help="library file (default: the runs' default)")
    sp.set_defaults(fn=cmd_skills_list)
    sp = sk.add_parser("show", help="one skill with its evidence (JSON)")
    sp.add_argument("name", help="'TRIGGER -> INTERVENTION', as `skills list` prints it")
    sp.add_argument("--library", type=Path, default=None)
    sp.set_defaults(fn=cmd_skills_show)
    return p


def main(argv: list[str] | None = None) -> int:
    import os

    # this process is ours: nothing it runs downloads (models resolve to local directories first)
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ.setdefault(var, "1")
    import transformers

    from evotrainer.trainer.pretrain import PretrainFailed
    transformers.utils.logging.disable_progress_bar()  # our own progress bars say enough
    out = sys.stdout  # our JSON only: what libraries print there while a command runs (Ray's
    try:              # cluster messages, a tracker's chatter) goes to stderr with the rest
        args = build_parser().parse_args(argv)
        with contextlib.redirect_stdout(sys.stderr):
            result = args.fn(args)
    except (UsageError, BadOutput) as e:  # BadOutput: a file given to read (evidence, a run) is malformed
        print(f"evotrainer: error: {e}", file=sys.stderr)
        return 2
    except (RunFailed, HarnessFailed, PretrainFailed) as e:  # the work ran and failed (a harness bug, a timeout): exit 1
        print(f"evotrainer: failed: {e}", file=sys.stderr)
        return 1
    except Rejected as e:
        print(json.dumps(e.result), file=out)
        print(f"evotrainer: rejected: {e}", file=sys.stderr)
        return 1
    if result is not None:  # commands a person reads (run, status, lineage) print JSON only when asked
        print(json.dumps(result), file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

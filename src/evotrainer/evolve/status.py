"""What `status` and `lineage` print: read-only views of a run's lineage store."""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Sequence

from evotrainer.errors import UsageError
from evotrainer.evolve.approval import waiting
from evotrainer.evolve.search import specialists
from evotrainer.lineage import LineageStore, Logged
from evotrainer.lineage.events import (
    ControllerRevised,
    Escalated,
    FinalFinished,
    RunFinished,
    RunStarted,
    SessionStarted,
    Stopped,
    TrialStarted,
)


def open_run(run_dir: Path | str) -> LineageStore:
    path = Path(run_dir) / "lineage.sqlite"
    if not path.is_file():
        raise UsageError(f"no run at '{run_dir}' (expected lineage.sqlite from `evotrainer run`)")
    return LineageStore(path)


def status(run_dir: Path | str) -> dict:
    store = open_run(run_dir)
    try:
        trials, log, pending = store.trials(), store.log(), store.pending()
    finally:
        store.close()
    events = [x.event for x in log]
    of = lambda cls: [e for e in events if isinstance(e, cls)]  # noqa: E731
    final, started = of(FinalFinished), (of(RunStarted) or [None])[0]
    wall = controller_seconds(log)
    # building the base is training too (SFT), and so is the final comparison's retraining
    spent = [t.budgets for t in trials] + [f.budgets for f in final]
    train = sum(b.get("train_s", 0.0) for b in spent) + sum(e.base_s for e in of(RunStarted))
    evaluate = sum(b.get("eval_s", 0.0) for b in spent)
    kept = [t for t in trials if t.label == "kept"]
    best = max(kept, key=lambda t: t.fitness.mean_val, default=None)
    sessions = [e for e in of(SessionStarted) if e.sandbox is not None]
    # what proposing cost where an llm proposed: each trial's latest start, which carries
    # every round of a revised trial, as its recorded budgets do
    latest = {e.trial: e.plan for e in of(TrialStarted)}
    return {
        # what trains and where (runs from before backends were recorded show null)
        "task": started and started.task, "base": started and started.base,
        "backend": started and started.runtime and started.runtime["backend"],
        "device": started and started.device,   # as resolved: cuda, bfloat16
        "executor": started and started.executor,  # local pool or Ray (runs before it: local)
        # full fine-tuning or LoRA, and what a checkpoint of the latest trial that trained holds
        # (runs from before `weights` was recorded show no key: their status reads as it did)
        **({"policy": policy_text(started.runtime, next((b["checkpoint"] for b in reversed(spent)
                                                         if "checkpoint" in b), None))}
           if started and "weights" in (started.runtime or {}).get("policy", {}) else {}),
        # the isolation of untrusted code in the latest session (a fallback is a WARNING line)
        "sandbox": sessions[-1].sandbox["detail"] if sessions else None,
        "trials": len(trials), "labels": dict(Counter(t.label for t in trials)),
        "pending": [s.trial for s in pending],
        "best": None if best is None else {"version": best.version, "depth": best.depth,
                                           "val": _by_seed(best.fitness.val), "test": _by_seed(best.fitness.test)},
        # sd of a paired difference between re-runs of the root harness: what the gate's bar is built on
        "noise_sd": next((t.fitness.noise_sd for t in trials if t.id == 0), None),
        "escalations": len(of(Escalated)),
        "crossovers": sum(t.intervention == "crossover" for t in trials),
        # an evolving search controller's revisions of its policy, each with the trials it cites
        # (a run with none, as every run before them, shows no key: its status reads as it did)
        **({"controller_revisions": [revision(e) for e in of(ControllerRevised)]} if of(ControllerRevised) else {}),
        "agent_tokens": _tokens([(p.usage if p else None) or {} for p in latest.values()]),
        "waiting": [{"trial": e.trial, "point": e.point, "intervention": e.intervention} for e in waiting(events)],
        "state": "finished" if events and isinstance(events[-1], (FinalFinished, RunFinished, Stopped))
                 else "running or interrupted",
        "final": None if not final else {
            "winner": final[-1].winner, "seeds": final[-1].seeds,
            **{f"{split}_difference": final[-1].difference(split) for split in ("val", "test")}},
        # one per seed: trained, or materialised from the segment cache (config `cache`); null
        # for runs from before the cache, which did not count them
        "segments": {"trained": sum(b.get("segments_trained", 0) for b in spent),
                     "reused": sum(b.get("segments_reused", 0) for b in spent)}
        if any("segments_trained" in b for b in spent) else None,
        "wall_s": round(wall, 1), "train_s": round(train, 1), "eval_s": round(evaluate, 1),
        # everything that is neither training nor evaluation: agents, backtests, git, bookkeeping
        # (while a trial is in flight its training is not counted yet, so this reads high)
        "framework_overhead": round(1 - (train + evaluate) / wall, 4) if wall > 0 else None,
    }


def revision(e: ControllerRevised) -> dict:
    """A revision of the search controller's policy as status and the report show it."""
    return {"revision": e.revision, "after": e.after, "changes": e.changes, "reason": e.reason, "cites": e.cites}


def _tokens(usages: list[dict]) -> dict:
    return {k: sum(u.get(k, 0) for u in usages) for k in ("prompt_tokens", "completion_tokens", "requests")}


def controller_seconds(log: Sequence[Logged]) -> float:
    """Time the controller ran: each session from its start to its last event, added up."""
    if not log:
        return 0.0
    total, start, last = 0.0, log[0].t, log[0].t  # older logs: one session from the first event
    for x in log[1:]:
        if isinstance(x.event, SessionStarted):
            total, start = total + (last - start), x.t
        last = x.t
    return total + (last - start)


def lineage_tree(run_dir: Path | str) -> str:
    """The version tree: each version under its parent, with its label and fitness."""
    store = open_run(run_dir)
    try:
        trials, starts = store.trials(), store.events(TrialStarted)
    finally:
        store.close()
    # search.concurrency > 1: what each proposal read off the blackboard (trials in flight, new outcomes)
    read = specialists.blackboard({s.trial: s.plan for s in starts if s.plan})
    children: dict[str | None, list] = {}
    for t in trials:
        children.setdefault(t.parents[0] if t.parents else None, []).append(t)
    lines: list[str] = []

    def walk(parent, indent):
        for t in children.get(parent, []):
            f = t.fitness
            mean = f"val {f.mean_val:.3f}" if f.val else "not trained"
            gain = f", gain {f.gain:+.3f}" if f.gain is not None else ""
            mate = f" x {t.parents[1]}" if len(t.parents) > 1 else ""  # a crossover's second parent
            agent = t.budgets.get("agent") or {}
            tokens = f", {agent['prompt_tokens']}+{agent['completion_tokens']} tokens" if "prompt_tokens" in agent else ""
            lines.append(f"{'  ' * indent}{t.version or '(refused)'} #{t.id} [{t.intervention}{mate}] {t.label}: "
                         f"{mean}{gain}, depth {t.depth}{tokens}" + (f"; {read[t.id]}" if t.id in read else ""))
            if t.version and t.version != parent:
                walk(t.version, indent + 1)
    walk(None, 0)
    return "\n".join(lines)


def policy_text(runtime: dict, checkpoint: dict | None) -> str:
    """What trains and what a checkpoint holds, in a line: "LoRA r8 (alpha 16, all-linear) on
    bf16 weights: adapters of 67.4 KB a checkpoint, 16,384 trainable parameters"."""
    pol = runtime["policy"]
    lora, weights = pol.get("lora"), pol["weights"]
    targets = lora and lora["target_modules"]
    what = (f"LoRA r{lora['rank']} (alpha {lora['alpha']:g}, {targets if isinstance(targets, str) else ', '.join(targets)})"
            f" on {weights} weights" if lora else f"full fine-tuning, {weights} weights")
    if not checkpoint:
        return what
    kind = "adapters" if checkpoint.get("adapter") else "weights"
    params = checkpoint.get("trainable_params")
    return (f"{what}: {kind} of {_size(checkpoint['weights_bytes'])} a checkpoint"
            + (f", {params:,} trainable parameters" if params else ""))


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _by_seed(scores: dict[int, float]) -> dict[str, float]:
    """Seeds as the JSON keys status prints (and printed before outcomes were typed)."""
    return {str(s): v for s, v in scores.items()}

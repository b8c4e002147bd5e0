"""What `status` and `lineage` print: read-only views of a run's lineage store."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from evotrainer.errors import UsageError
from evotrainer.evolve.approval import waiting
from evotrainer.lineage import LineageStore


def open_run(run_dir: Path | str) -> LineageStore:
    path = Path(run_dir) / "lineage.sqlite"
    if not path.is_file():
        raise UsageError(f"no run at '{run_dir}' (expected lineage.sqlite from `evotrainer run`)")
    return LineageStore(path)


def _difference(d: dict) -> dict:
    """A final difference as status shows it; a run recorded before t intervals had a bootstrap CI."""
    return {"mean": d["mean"], "ci": d["ci"], "level": d["level"], "interval": d.get("interval", "bootstrap")}


def status(run_dir: Path | str) -> dict:
    store = open_run(run_dir)
    trials, events = store.trials(), store.events()
    wall = controller_seconds(events)
    final = store.events("final_finished")
    # building the base is training too (SFT), and so is the final comparison's replay
    spent = [t.budgets for t in trials] + [f["budgets"] for f in final]
    train = sum(b.get("train_s", 0.0) for b in spent) + sum(e.get("base_s", 0.0) for e in store.events("run_started"))
    evaluate = sum(b.get("eval_s", 0.0) for b in spent)
    kept = [t for t in trials if t.label == "kept"]
    best = max(kept, key=lambda t: sum(t.fitness["val"].values()) / len(t.fitness["val"]), default=None)
    last = events[-1]["kind"] if events else None
    started = store.events("run_started")
    runtime = started[0].get("runtime") if started else None
    return {
        # what trains and where (runs from before backends were recorded show null)
        "task": started[0].get("task") if started else None, "base": started[0].get("base") if started else None,
        "backend": runtime and runtime["backend"],
        "device": started[0].get("device") if started else None,   # as resolved: cuda, bfloat16
        "executor": started[0].get("executor", "local") if started else None,  # local pool or Ray (runs before it: local)
        # the isolation of untrusted code in the latest session (a fallback is a WARNING line)
        "sandbox": next((e["sandbox"]["detail"] for e in reversed(events)
                         if e["kind"] == "session_started" and "sandbox" in e), None),
        "trials": len(trials), "labels": dict(Counter(t.label for t in trials)),
        "pending": [n for n, _ in store.pending()],
        "best": None if best is None else {"version": best.version, "depth": best.depth,
                                           "val": best.fitness["val"], "test": best.fitness["test"]},
        # sd of a paired difference between re-runs of the root harness: what the gate's bar is built on
        "noise_sd": next((t.fitness.get("noise_sd") for t in trials if t.id == 0), None),
        "escalations": len(store.events("escalated")),
        "crossovers": sum(t.intervention == "crossover" for t in trials),
        # what proposing cost where an llm proposed: each trial's latest start, which carries
        # every round of a revised trial, as its recorded budgets do
        "agent_tokens": _tokens([e.get("usage") or {} for e in
                                 {e["trial"]: e for e in store.events("trial_started")}.values()]),
        "waiting": [{"trial": e["trial"], "point": e["point"], "intervention": e["intervention"]}
                    for e in waiting(events)],
        "state": "finished" if last in ("final_finished", "run_finished", "stopped") else "running or interrupted",
        "final": None if not final else {
            "winner": final[-1]["winner"], "seeds": final[-1]["seeds"],
            **{f"{split}_difference": _difference(final[-1]["comparison"][split]["difference"])
               for split in ("val", "test")}},
        "wall_s": round(wall, 1), "train_s": round(train, 1), "eval_s": round(evaluate, 1),
        # everything that is neither training nor evaluation: agents, backtests, git, bookkeeping
        # (while a trial is in flight its training is not counted yet, so this reads high)
        "framework_overhead": round(1 - (train + evaluate) / wall, 4) if wall > 0 else None,
    }


def _tokens(usages: list[dict]) -> dict:
    return {k: sum(u.get(k, 0) for u in usages) for k in ("prompt_tokens", "completion_tokens", "requests")}


def controller_seconds(events: list[dict]) -> float:
    """Time the controller ran: each session from its start to its last event, added up."""
    if not events:
        return 0.0
    total, start, last = 0.0, events[0]["t"], events[0]["t"]  # older logs: one session from the first event
    for e in events[1:]:
        if e["kind"] == "session_started":
            total, start = total + (last - start), e["t"]
        last = e["t"]
    return total + (last - start)


def lineage_tree(run_dir: Path | str) -> str:
    """The version tree: each version under its parent, with its label and fitness."""
    trials = open_run(run_dir).trials()
    children: dict[str | None, list] = {}
    for t in trials:
        children.setdefault(t.parents[0] if t.parents else None, []).append(t)
    lines: list[str] = []

    def walk(parent, indent):
        for t in children.get(parent, []):
            val = t.fitness.get("val") or {}
            mean = f"val {sum(val.values()) / len(val):.3f}" if val else "not trained"
            gain = f", gain {t.fitness['gain']:+.3f}" if "gain" in t.fitness else ""
            mate = f" x {t.parents[1]}" if len(t.parents) > 1 else ""  # a crossover's second parent
            agent = t.budgets.get("agent") or {}
            tokens = f", {agent['prompt_tokens']}+{agent['completion_tokens']} tokens" if "prompt_tokens" in agent else ""
            lines.append(f"{'  ' * indent}{t.version or '(refused)'} #{t.id} [{t.intervention}{mate}] {t.label}: "
                         f"{mean}{gain}, depth {t.depth}{tokens}")
            if t.version and t.version != parent:
                walk(t.version, indent + 1)
    walk(None, 0)
    return "\n".join(lines)

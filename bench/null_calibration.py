"""Does the gate keep a child with no effect at most `promotion.alpha` of the time, and does the
final comparison's interval say 'beat' no more often than its level allows?

Two modes:

    .venv/bin/python bench/null_calibration.py --simulate     # seconds: the real gate and
        # interval code on simulated normal noise, new rules beside the old ones
    .venv/bin/python bench/null_calibration.py                # real runs (~1 hour on 2 cores)

Real mode, on the quickstart's task and base (configs/quickstart.yaml) with shorter training,
from a root harness that learns there (`--harness`, default per-digit partial credit: the
reference recipe decays to ~0% on this base, where every null difference would be ~0):

- Null trials through the real loop: `--runs` independent runs (each its own search seeds,
  so its own noise replicas) of `--trials` trials each, where the agent proposes a change
  with no effect: `top_k` above the vocabulary size (sampling is unchanged; only the
  harness's content, and so its sampling stream, differs). The backtest's twin check would
  call such a child equivalent and never train it, so backtests are off here: every null
  child trains against its control and meets the real gate, extra seed pairs included.
  Prints the false-keep rate with its exact binomial 95% CI beside alpha, and what the
  previous gate (z = 2 against max(the seeds' se, the noise sd / sqrt(n))) would have said
  on the same numbers. The trials of one run share its measured null, so they are not
  independent: the interval is optimistic by that much, which is why the runs are several.
- Null final comparisons: the root harness and a no-op copy trained from the base on fresh
  seeds by the final comparison's own replay, grouped as finals of 3 seeds (the old
  `final_seeds` count) and 5 (today's): how often the 95% t interval says 'beat' (nominal
  2.5%) and misses zero (nominal 5%), beside the old percentile bootstrap at 3; over disjoint
  groups (independent, few) and over every subset of the seeds (overlapping, so its
  interval is a jackknife over seeds, not a binomial one).

Trained work is kept under bench-runs/null-calibration (delete it to measure again); the
null finals' differences are kept in finals.json there, so a larger `--finals` only trains
the seeds it adds.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(var, "1")  # nothing here downloads

from evotrainer.agents import Proposal  # noqa: E402
from evotrainer.config import PromotionConfig, config_from_dict  # noqa: E402
from calibration import Rate, old_gate_keeps, simulate_gate, simulate_interval, subset_rate  # noqa: E402
from evotrainer.evolve.controller import Controller  # noqa: E402
from evotrainer.evolve.segments.retrain import Arm, retrain  # noqa: E402
from evotrainer.evolve.stats.paired import bootstrap_ci, null_differences, paired_differences, t_interval  # noqa: E402
from evotrainer.labels import Label  # noqa: E402
from evotrainer.lineage import LineageStore, TrialRecord  # noqa: E402

NO_OP_TOP_K = 100_000  # above any vocabulary here: filter_logits keeps every token


def null_agent(ctx) -> Proposal:
    """A change with no effect on what is learned: top_k above the vocabulary (a new value each
    trial, so each child is a new harness with its own sampling stream)."""
    return Proposal(intervention=f"null-{ctx.trial}", family="exploration",
                    hypothesis="top_k above the vocabulary changes nothing but the sampling stream",
                    frozen="everything else", success_criterion="none: a null child", rollback="-",
                    knobs={"top_k": NO_OP_TOP_K + ctx.trial}, agent="null")


def bench_config(config: Path, harness: Path, seeds: list[int], trials: int, steps: int) -> dict:
    raw = yaml.safe_load(config.read_text())
    raw |= {"seeds": seeds, "final_seeds": [], "agent": "rules", "harness": str(harness),
            # the config's search mode stays: restart mode trains every child from the base
            "search": raw.get("search", {}) | {"selection": "greedy", "crossover": False, "escalation": False,
                                               "skills": None}}
    raw["budget"] = raw.get("budget", {}) | {"trials": trials, "total_steps": steps, "steps_per_segment": steps,
                                             "wall_clock_s": 10 ** 6}
    return raw


def null_trials(config: Path, harness: Path, runs: int, trials: int, steps: int,
                out: Path) -> tuple[list[dict], Controller]:
    rows, ctl = [], None
    for r in range(runs):
        raw = bench_config(config, harness, [2 * r + 10, 2 * r + 11], trials, steps)
        cfg = config_from_dict(raw).validate()
        run = out / f"gate-run-{r}"
        t = time.time()
        ctl = Controller(cfg, run, agent=null_agent, run_backtests=False,
                         on_event=lambda e: isinstance(e, TrialRecord) and print(
                             f"  run {r}: trial {e.id} {e.label}", flush=True))
        ctl.run()
        store = LineageStore(run / "lineage.sqlite")
        try:
            ts = store.trials()
        finally:
            store.close()
        root = next(t_ for t_ in ts if t_.id == 0)
        null = null_differences(root.fitness.val, root.fitness.replicas)
        for tr in ts:
            if not tr.parents or tr.label not in (Label.KEPT, Label.DISCARDED, Label.INVALID):
                continue
            f, d = tr.fitness, tr.fitness.decision
            first = paired_differences(f.val, d.control_val)
            rows.append({"run": r, "trial": tr.id, "label": tr.label, "gain": d.gain, "rule": d.rule or None,
                         "pairs": len(first) + len(d.extra_pairs), "first": first, "null": null,
                         "old_keep": old_gate_keeps(first, null, min_gain=cfg.promotion.min_gain)})
        print(f"  run {r}: {len(rows)} null trials so far, {time.time() - t:.0f} s; noise sd "
              f"{100 * (root.fitness.noise_sd or 0):.2f} points", flush=True)
    return rows, ctl


def finals_controller(config: Path, harness: Path, steps: int, out: Path) -> Controller:
    """A controller set up (base built or read from the cache, split key in force, sandbox
    level chosen) but not run: the final comparison's replay needs its task, base and runtime."""
    from evotrainer.executors import use_isolation
    cfg = config_from_dict(bench_config(config, harness, [10, 11], 1, steps)).validate()
    ctl = Controller(cfg, out / "finals-setup", agent=null_agent, run_backtests=False)
    ctl.isolation = use_isolation(cfg.sandbox)
    ctl.setup()  # noqa: SLF001 (the bench replays without a search)
    return ctl


def null_finals(ctl: Controller, harness: Path, finals: int, steps: int, out: Path) -> dict:
    """The root harness against a no-op copy of itself on 3 x `finals` fresh seeds, through the
    final comparison's own replay."""
    copy = out / "no-op-copy"
    if not copy.exists():
        shutil.copytree(harness, copy)
        with open(copy / "knobs.yaml", "a") as f:
            f.write(f"top_k: {NO_OP_TOP_K}\n")
    seeds = list(range(300, 300 + 3 * finals))
    record = out / "finals.json"  # seeds measured before are read back: a larger --finals only adds seeds
    done = {int(s): d for s, d in json.loads(record.read_text()).items()} if record.exists() else {}
    todo = [s for s in seeds if s not in done]
    if todo:
        arms = {"reference": Arm((str(harness),), steps), "copy": Arm((str(copy),), steps)}
        rep = retrain(ctl.task, ctl.base, arms, todo, out / "finals", evaluation=ctl.cfg.evaluation, timeout_s=3600,
                      runtime=ctl.runtime, memory_mb=ctl.cfg.worker_memory_mb)
        done |= {s: rep.scores["copy"][s]["test"] - rep.scores["reference"][s]["test"] for s in todo}
        record.write_text(json.dumps({str(s): d for s, d in sorted(done.items())}))
    return {s: done[s] for s in seeds}


def finals_report(values: list[float]) -> None:
    """The null differences grouped as final comparisons of 3 seeds (the default before issue 32)
    and 5 (today's): disjoint groups (independent, few: exact binomial CIs) and every subset
    (overlapping: a jackknife over seeds). The bootstrap only at 3: 850,668 five-seed subsets of
    42 seeds are too many to resample each."""
    for n, intervals in ((3, (("t interval", t_interval), ("percentile bootstrap", bootstrap_ci))),
                         (5, (("t interval", t_interval),))):
        disjoint = [values[i:i + n] for i in range(0, len(values) - n + 1, n)]
        for name, interval in intervals:
            ci = functools.lru_cache(maxsize=None)(lambda xs, f=interval: f(list(xs)))  # each subset once
            said_beat = lambda xs: ci(tuple(xs))[0] > 0  # noqa: E731
            missed = lambda xs: not ci(tuple(xs))[0] <= 0 <= ci(tuple(xs))[1]  # noqa: E731
            print(f"null finals of {n} seeds, {name}: {len(disjoint)} disjoint: 'beat' "
                  f"{Rate(sum(map(said_beat, disjoint)), len(disjoint))}, misses 0 "
                  f"{Rate(sum(map(missed, disjoint)), len(disjoint))}; every subset: 'beat' "
                  f"{subset_rate(values, n, said_beat)}, misses 0 {subset_rate(values, n, missed)}", flush=True)


def simulated(alpha: float | None = None, sd: float = 0.022) -> None:
    """The gate and the interval on normal noise of sd `sd` (fractions: 0.022 is 2.2 points);
    the planted gains are 1, 2 and 3 of those sd."""
    cfg = PromotionConfig() if alpha is None else PromotionConfig(alpha=alpha)
    print(f"simulated: the real gate on normal noise (sd {100 * sd:.1f} points), alpha {cfg.alpha}, "
          f"{cfg.replicas} replicas, {cfg.extra_pairs} extra pairs at most; 20,000 null trials a row")
    print(f"{'seeds':>5} {'replicas':>8}  {'new gate keeps':>34}  {'old gate keeps':>34}  {'pairs':>5}")
    for seeds, reps in ((2, 1), (2, 2), (3, 2)):
        r = simulate_gate(0.0, sd=sd, seeds=seeds, replicas=reps, cfg=cfg)
        print(f"{seeds:>5} {reps:>8}  {str(r['new']):>34}  {str(r['old']):>34}  {r['mean_pairs']:5.2f}")
    print("\npower (2 seeds, 2 replicas): how often a real gain is kept; 4,000 trials a row")
    for effect, name in ((sd, f"+{100 * sd:.1f} points (1 sd)"), (2 * sd, f"+{200 * sd:.1f} (2 sd)"),
                         (3 * sd, f"+{300 * sd:.1f} (3 sd)"), ([0.547, 0.16], "+54.7 and +16.0 (issue 32's run)")):
        r = simulate_gate(effect, sd=sd, trials=4000, cfg=cfg)
        print(f"  {name:34} new {str(r['new']):34} old {str(r['old']):34} pairs {r['mean_pairs']:.2f}")
    print("\nchildren with a reward-score divergence (a refutable blocking claim: kept only where the gate "
          "keeps), 2 seeds, 2 replicas")
    claim = ["reward_score_divergence = 0.05"]
    for effect, name, n in ((0.0, "null (20,000 trials)", 20_000), (sd, f"+{100 * sd:.1f} points", 4000),
                            (2 * sd, f"+{200 * sd:.1f}", 4000), (3 * sd, f"+{300 * sd:.1f}", 4000)):
        r = simulate_gate(effect, sd=sd, trials=n, cfg=cfg, unbacked=claim)
        print(f"  {name:34} kept {str(r['new']):34} pairs {r['mean_pairs']:.2f}")
    print("\nnull final comparisons: how often a 95% interval misses 0 (nominal 5%) and says 'beat' (2.5%)")
    for n in (2, 3, 5):
        r = simulate_interval(n)
        print(f"  {n} seeds: t interval misses {r['t_miss']}, beats {r['t_beat']}; "
              f"percentile bootstrap misses {r['boot_miss']}, beats {r['boot_beat']}")


def trials_report(args) -> None:
    rows, ctl = null_trials(args.config, args.harness.resolve(), args.runs, args.trials, args.steps, args.out)
    (args.out / "null_trials.json").write_text(json.dumps(rows, indent=2))
    alpha = ctl.cfg.promotion.alpha
    keeps = Rate(sum(r["label"] == Label.KEPT for r in rows), len(rows))
    old = Rate(sum(r["old_keep"] for r in rows), len(rows))
    print(f"\nnull trials through the real gate ({args.runs} runs x {args.trials}, {args.steps} steps a segment): "
          f"kept {keeps} (alpha {100 * alpha:.1f}%); the old gate on the same first-look numbers: kept {old} "
          f"(nominal ~2.3%); mean seed pairs {sum(r['pairs'] for r in rows) / max(len(rows), 1):.2f}; "
          f"rules {dict((k, sum(r['rule'] == k for r in rows)) for k in ('keep', 'discard'))}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--simulate", action="store_true", help="only the simulated mode (seconds)")
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "quickstart.yaml")
    p.add_argument("--harness", type=Path, default=ROOT / "examples" / "harnesses" / "partial_credit",
                   help="the root harness of the null runs")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--trials", type=int, default=8, help="null trials per run")
    p.add_argument("--finals", type=int, default=14, help="fresh seeds for the null finals: 3 x this")
    p.add_argument("--steps", type=int, default=50, help="training steps per segment")
    p.add_argument("--out", type=Path, default=ROOT / "bench-runs" / "null-calibration")
    p.add_argument("--only", choices=("trials", "finals"), help="one half of the real mode")
    p.add_argument("--alpha", type=float, default=None, help="the simulated gate at this promotion.alpha "
                   "instead of the default")
    p.add_argument("--sd", type=float, default=2.2, help="the simulated noise's sd, in points (2.2: the "
                   "quickstart root's replicas; at 60 steps they read 0.2-9.9, median 2.0, over five bases)")
    args = p.parse_args()
    if args.simulate:
        return simulated(args.alpha, args.sd / 100)
    import transformers
    transformers.logging.disable_progress_bar()
    t0 = time.time()
    if args.only != "finals":
        trials_report(args)
    if args.only == "trials":
        return
    ctl = finals_controller(args.config, args.harness.resolve(), args.steps, args.out)
    diffs = null_finals(ctl, args.harness.resolve(), args.finals, args.steps, args.out)
    finals_report([diffs[s] for s in sorted(diffs)])
    sd = (sum(d * d for d in diffs.values()) / len(diffs)) ** 0.5
    print(f"null final differences: sd {100 * sd:.2f} test points over {len(diffs)} seeds; "
          f"wall {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()

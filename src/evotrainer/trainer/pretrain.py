"""Build the base checkpoint: deterministic SFT of the tiny policy on the task's train stream.

RL needs a base that is right sometimes: a policy that never solves a problem gives every
group the same reward and GRPO no gradient. So SFT stops as soon as greedy accuracy on
*probes* (drawn from the train stream, never from validation or test) reaches
`target_acc`, which leaves room for RL. The result is cached by its config hash, beside
its split key (tasks/keys.py): which problems of the public held-out pool every run on this
base scores for validation and which for test.

Each check draws a fresh probe and the stop reads the mean of the last `smooth` checks:
a single 200-problem probe at a 5% target has a standard error of 1.5 points, and stopping
at the first check that clears the bar picks the luckiest draw (a base that stopped at a
6% probe scored 3.8% on validation). Averaging fresh probes measures the model, not the draw.
But the mean of checks spread over 30 steps lags a model that is climbing fast (2%, 4%, 9%
averages 5%): stopping on it kept the model of the last check, which scored 9.6% on
validation against a 5% target (quickstart base seed 3). The mean describes the model at the
middle of its window, so that checkpoint, kept in memory, is the base.

A task may probe sampled instead of greedy (`Task.sft_probe_temperature`): RL samples, and
a multi-turn base can be far better greedily than sampled (vault: 37% against 0.6%).
"""
from __future__ import annotations

import hashlib
import json
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from evotrainer import __version__
from evotrainer.catalog import get_task
from evotrainer.envs import EnvTask, Episode, pad
from evotrainer.errors import UsageError
from evotrainer.evaluate import accuracy
from evotrainer.evaluate.sampled import correct_counts
from evotrainer.policy import build_model, build_tokenizer, load_policy, save_policy
from evotrainer.policy.config import PolicyConfig
from evotrainer.policy.prompts import observation_token_ids, prompt_token_ids
from evotrainer.tasks import Task
from evotrainer.tasks.base import HELD_OUT_SHARE
from evotrainer.tasks.keys import DEFAULT_CACHE, split_key

RESTART_STRIDE = 7919  # the init seed of attempt a (from 0): seed + RESTART_STRIDE * a


@dataclass(frozen=True)
class PretrainConfig:
    seed: int = 0
    levels: tuple[int, ...] = ()    # SFT mix; empty: target level and the one below it
    # 0: SFT from a fresh initialisation. N: continue from the default base for level N
    # (built or reused first). None: the task's own (Task.sft_warm_start). A target longer
    # than anything a model saw is out of reach for a 1M-parameter model from scratch (4-digit
    # from scratch: 1% after 1500 steps), but continued SFT from the 25% 3-digit base on a
    # 2/3/4 mix reached 5% on a 4-digit probe in 1360 steps (164 s): a weak base on the
    # target, where the harness matters.
    warm_start: int | None = None
    target_acc: float = 0.0         # stop once probe accuracy on the target level reaches this; 0: the task's own
    max_steps: int = 0              # 0: the task's own (Task.sft_max_steps, 1500 unless it says)
    batch_size: int = 0             # 0: the task's own (Task.sft_batch_size, 128 unless it says)
    # 3e-3 (the prototype's) sat on a loss plateau of ~1.4 for 700+ steps on two seeds once
    # the train stream changed order, and collapsed later; 1e-3 broke through by step ~300
    # and climbed steadily (25% at ~480, 90% by 700), which a stop-at-target SFT needs.
    lr: float = 1e-3
    warmup_steps: int = 20
    check_every: int = 0            # probe every this many steps; 0: the task's own (Task.sft_check_every)
    probe_size: int = 0             # problems per check, a fresh draw each time; 0: the task's own (200 unless it says)
    smooth: int = 3                 # the stop reads the mean of this many last checks
    # From scratch, SFT on addition sits on a loss plateau (~0.7) for a number of steps that
    # depends on the initialisation: seed 0 broke through by step ~450, seeds 1 and 2 were
    # still at 1% after 1000-1500 steps. A fresh machine's floats are another draw, so a run
    # below half the target after `patience` steps starts again from a new initialisation
    # (seed + 7919 * attempt), at most `restarts` times; the metadata records the attempts.
    patience: int = 600
    restarts: int = 3
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    ffn: int = 512

    def validate(self) -> None:
        if not 0 < self.target_acc <= 1:
            raise ValueError(f"target_acc must be in (0, 1], got {self.target_acc}")
        if self.max_steps < 1 or self.batch_size < 1 or self.probe_size < 1:
            raise ValueError("max_steps, batch_size and probe_size must be positive")
        if self.patience < 1 or self.restarts < 0:
            raise ValueError(f"patience must be >= 1 and restarts >= 0, got {self.patience} and {self.restarts}")
        if self.smooth < 1:
            raise ValueError(f"smooth must be >= 1 (checks averaged), got {self.smooth}")
        if self.warm_start < 0:
            raise ValueError(f"warm_start must be 0 (fresh) or a level, got {self.warm_start}")


def resolved(task: Task, cfg: PretrainConfig) -> PretrainConfig:
    """The config with the task's own defaults filled in (what the cache key hashes)."""
    return replace(cfg, check_every=cfg.check_every or task.sft_check_every,
                   probe_size=cfg.probe_size or task.sft_probe_size,
                   target_acc=cfg.target_acc or task.sft_target_acc,
                   warm_start=task.sft_warm_start if cfg.warm_start is None else cfg.warm_start,
                   max_steps=cfg.max_steps or task.sft_max_steps, batch_size=cfg.batch_size or task.sft_batch_size)


def cache_key(task: Task, cfg: PretrainConfig) -> str:
    cfg = resolved(task, cfg)
    fields = {k: v for k, v in asdict(cfg).items() if k != "warm_start" or v}  # older bases keep their keys
    blob = json.dumps({"task": task.name, "target": task.target_level, "v": __version__,
                       "train_stream": f"indexed, outside a public held-out pool (1/{HELD_OUT_SHARE})",
                       "tokenizer": "adds its own <bos>",  # older bases' tokenizers did not
                       "stop": "the model at the middle of the smoothing window", **fields,
                       **({"probe_temperature": task.sft_probe_temperature} if task.sft_probe_temperature else {})},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def base_path(task: Task, cfg: PretrainConfig, cache_dir: Path = DEFAULT_CACHE) -> Path:
    return Path(cache_dir) / f"base-{task.name.replace(':', '_')}-{task.target_level}-{cache_key(task, cfg)}"


def sft_batch(tok, problems, task: Task | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded BOS+prompt+answer+EOS and a loss mask over answer and EOS only; for a
    multi-turn task, its expert episodes with the loss on the policy's turns only.

    Right padding needs no attention mask in a causal model (pads come after every real
    token), so attention takes the fused causal path; positions match generation's.
    """
    if isinstance(task, EnvTask):
        return episode_batch(tok, task, problems)
    texts = [tok.bos_token + p.prompt + p.answer + tok.eos_token for p in problems]
    enc = tok(texts, add_special_tokens=False, padding=True, padding_side="right", return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    T = ids.shape[1]
    end = mask.sum(-1, keepdim=True)
    ans_len = torch.tensor([[len(p.answer) + 1] for p in problems])
    t = torch.arange(T)[None, :]
    return ids, ((t >= end - ans_len) & (t < end)).long()


def episode_batch(tok, task: EnvTask, problems) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert episodes built as the trainer builds them (envs/episode.py): the same ids, each
    policy turn ending in EOS, observations tokenized once; the loss mask is the episode's."""
    rows = []
    for p in problems:
        ep = Episode(prompt_token_ids(tok, [p.prompt], chat_template=False)[0])
        for text, obs in task.demonstration(p):
            ep.add(tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id],
                   observation_token_ids(tok, obs, chat_template=False) if obs else [])
        rows.append(ep.assemble())
    ids, mask, _ = pad(rows, tok.pad_token_id)
    return torch.tensor(ids), torch.tensor(mask)


def sft_loss(model, ids, loss_mask) -> torch.Tensor:
    logits = model(input_ids=ids).logits[:, :-1]
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    m = loss_mask[:, 1:].float()
    return (nll * m).sum() / m.sum()


class PretrainFailed(RuntimeError):
    """SFT ended without reaching its target accuracy: nothing was cached."""


@dataclass(frozen=True)
class SftStage:
    """One SFT a base still needs: `task` at its target level, under `cfg` (resolved)."""
    task: Task
    cfg: PretrainConfig

    @property
    def label(self) -> str:
        start = f"from level {self.cfg.warm_start}'s base" if self.cfg.warm_start else "from scratch"
        return f"{self.task.name} level {self.task.target_level} {start}"

    @property
    def typical(self) -> int:
        """SFT steps the task's default base recipe took to this stage's target when measured;
        0 for another recipe or an unmeasured target."""
        own = resolved(self.task, replace(PretrainConfig(), seed=self.cfg.seed, target_acc=self.cfg.target_acc))
        return self.task.sft_measured_steps(self.cfg.target_acc) if self.cfg == own else 0


@dataclass(frozen=True)
class SftProgress:
    """A probe check of one SFT stage, for a progress display."""
    stage: str        # SftStage.label
    step: int
    expected: int     # steps the stage took when measured (0: not measured for this recipe)
    cap: int          # max_steps
    loss: float
    probe_acc: float  # the smoothed probe the stop reads
    target: float

    @property
    def total(self) -> int:
        """The bar's length: the measured steps while the stage is within them, then the cap
        (the stop comes at the target, whenever the probe reaches it)."""
        return self.expected if self.step < self.expected else self.cap


def stages_to_build(task: Task, cfg: PretrainConfig = PretrainConfig(), cache_dir: Path = DEFAULT_CACHE) -> list[SftStage]:
    """The SFT stages `pretrain` would run, first to last: none when the base is cached."""
    cfg = resolved(task, cfg)
    if (base_path(task, cfg, cache_dir) / "base_meta.json").exists():
        return []
    sft = task.sft_task() if isinstance(task, EnvTask) else task
    if isinstance(sft, EnvTask) and not sft.demonstrates():
        raise UsageError(f"{task.name} has no demonstrations to build the default base from: name a model "
                         "(--model DIR, or `model:` in the run config)")
    lower = stages_to_build(get_task(task.spec, cfg.warm_start), PretrainConfig(seed=cfg.seed), cache_dir) \
        if cfg.warm_start in task.levels and cfg.warm_start < task.target_level else []
    return lower + [SftStage(sft, cfg)]


def announce(stages: list[SftStage]) -> str:
    """What building a base will do and about how long it takes, said before it starts."""
    what = ", then ".join(f"{s.label} to {s.cfg.target_acc:.0%} of a train probe" for s in stages)
    took = (f"measured: about {sum(s.typical for s in stages)} SFT steps (the bar's ETA follows this machine)"
            if all(s.typical for s in stages) else
            f"not measured for this recipe: at most {sum(s.cfg.max_steps for s in stages)} SFT steps, "
            "stopping at the target")
    return f"Building the base model once (cached for later runs): {what}; {took}."


def pretrain(task: Task, cfg: PretrainConfig = PretrainConfig(), cache_dir: Path = DEFAULT_CACHE,
             progress=None, require_target: bool | None = None) -> tuple[Path, dict]:
    """Return (checkpoint path, metadata), training only if the cache has no such base.
    `progress`, if given, is called with an SftProgress at every probe check.

    A base that misses `target_acc` within `max_steps` would leave RL nothing to learn
    from (every group dead), so it raises PretrainFailed instead of being cached, unless
    `require_target` is False (None: the task's own, Task.sft_require_target).
    """
    cfg = resolved(task, cfg)
    require_target = task.sft_require_target if require_target is None else require_target
    try:
        cfg.validate()
    except ValueError as e:
        raise UsageError(str(e)) from None
    out = base_path(task, cfg, cache_dir)
    task.use_key(split_key(out.name, Path(cache_dir)))  # the base's own split: SFT trains outside its held-out pool
    if isinstance(task, EnvTask):  # a control variant (vault?tool=off) starts from the plain task's base
        task, key = task.sft_task(), task.key
        task.use_key(key)
    meta_file = out / "base_meta.json"
    if meta_file.exists():
        return out, json.loads(meta_file.read_text())
    t0 = time.time()
    stage = SftStage(task, cfg)
    label, expected = stage.label, stage.typical  # once, not at every probe check

    def shown(step: int, loss: float, acc: float) -> None:
        if progress:
            progress(SftProgress(label, step, expected, cfg.max_steps, loss, acc, cfg.target_acc))

    first = cfg.warm_start or task.target_level
    levels = list(cfg.levels) or [lv for lv in task.levels if first - 1 <= lv <= task.target_level] \
        or [task.target_level]
    if cfg.warm_start:
        if cfg.warm_start not in task.levels or cfg.warm_start >= task.target_level:
            raise UsageError(f"warm_start must be a level below the target {task.target_level}, "
                             f"one of {[lv for lv in task.levels if lv < task.target_level]}")
        start, _ = pretrain(get_task(task.spec, cfg.warm_start), PretrainConfig(seed=cfg.seed), cache_dir, progress)
        model, tok = load_policy(start, PolicyConfig(device="cpu"))  # the SFT below runs on the CPU
        step, probe_acc = _sft(task, cfg, model, tok, seed=cfg.seed, levels=levels, progress=shown, patience=None)
        attempts = 1
    else:
        tok = build_tokenizer()
        # restarts are for a target that must be reached; a base kept short of it is one capped
        # attempt (the announcement said at most max_steps)
        restarts = cfg.restarts if require_target else 0
        for attempts in range(1, restarts + 2):
            seed = cfg.seed + RESTART_STRIDE * (attempts - 1)  # attempt 1 is the seed itself
            model = build_model(len(tok), hidden=cfg.hidden, layers=cfg.layers, heads=cfg.heads, ffn=cfg.ffn, seed=seed)
            last = attempts == restarts + 1
            step, probe_acc = _sft(task, cfg, model, tok, seed=seed, levels=levels, progress=shown,
                                   patience=None if last else cfg.patience)
            if step is not None:
                break
    if require_target and probe_acc < cfg.target_acc:
        raise PretrainFailed(f"SFT reached probe accuracy {probe_acc:.2f} in {step} steps, short of target_acc "
                             f"{cfg.target_acc:g}; nothing was cached (try another --base-seed or a lower --target-acc)")
    meta = {"task": task.name, "target_level": task.target_level, "sft_levels": levels, "warm_start": cfg.warm_start,
            "steps": step, "probe_acc": probe_acc, "attempts": attempts, "seconds": round(time.time() - t0, 1),
            "params": sum(p.numel() for p in model.parameters()), "config": asdict(cfg)}
    tmp = out.with_name(out.name + ".tmp")
    save_policy(model, tok, tmp)
    meta = json.loads(json.dumps(meta))  # the same plain JSON a cache hit returns
    (tmp / "base_meta.json").write_text(json.dumps(meta, indent=2))
    tmp.rename(out)  # atomic: a killed pretrain never leaves a half-written cached base
    return out, meta


def _sft(task: Task, cfg: PretrainConfig, model, tok, *, seed: int, levels: list[int], progress,
         patience: int | None) -> tuple[int | None, float]:
    """SFT `model` in place until the smoothed probe reaches the target or max_steps pass:
    (steps taken, smoothed probe accuracy). With `patience`, a run still below half the
    target by then gives up early and returns (None, accuracy): it is stuck on a plateau."""
    torch.manual_seed(seed)
    stream = task.train_stream(seed)
    probe_stream = task.train_stream(seed + 1_000_003)
    checks: list[float] = []
    states: list[tuple[int, dict]] = []  # (step, weights) of the checks the smoothed mean reads
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.99), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / cfg.warmup_steps))
    probe_acc, step = 0.0, 0
    model.train()
    for step in range(1, cfg.max_steps + 1):
        batch = stream.batch([rng.choice(levels) for _ in range(cfg.batch_size)])
        loss = sft_loss(model, *sft_batch(tok, batch, task))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % cfg.check_every == 0:
            probe = [probe_stream.draw(task.target_level) for _ in range(cfg.probe_size)]
            checks.append(probe_accuracy(model, tok, task, probe, seed=len(checks)))
            probe_acc = sum(checks[-cfg.smooth:]) / len(checks[-cfg.smooth:])
            states = (states + [(step, {k: v.detach().clone() for k, v in model.state_dict().items()})])[-cfg.smooth:]
            if progress:
                progress(step, loss.item(), probe_acc)
            if len(checks) >= cfg.smooth and probe_acc >= cfg.target_acc:
                step, weights = states[len(states) // 2]  # the model the mean describes
                model.load_state_dict(weights)
                break
            if patience is not None and step >= patience and probe_acc < cfg.target_acc / 2:
                return None, probe_acc
    return step, probe_acc


def probe_accuracy(model, tok, task: Task, probe: list, seed: int) -> float:
    """Greedy accuracy, or one sample per problem at the task's probe temperature."""
    if not task.sft_probe_temperature:
        return accuracy(model, tok, task, probe)
    return sum(correct_counts(model, tok, task, probe, n=1, temperature=task.sft_probe_temperature, seed=seed,
                              batch_size=len(probe))) / len(probe)


def load_base(task: Task, cfg: PretrainConfig = PretrainConfig(), cache_dir: Path = DEFAULT_CACHE):
    path, meta = pretrain(task, cfg, cache_dir)
    return (*load_policy(path), path, meta)

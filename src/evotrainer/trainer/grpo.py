"""The embedded GRPO trainer: small, readable, fast on a CPU, every choice a harness slot.

One step: the curriculum picks levels -> sample prompts -> KV-cached sampling of a group
per prompt -> verifier scores -> harness reward -> group filter -> advantages -> clipped
policy loss (+ KL, - entropy) per token -> aggregation -> AdamW step, accumulated over
micro-batches when the batch does not fit at once. Tensors live on the model's device;
harness slots run on the CPU, on plain tensors. Each step returns
its metrics and one evidence record per rollout. The trainer knows nothing of
evaluation: the caller decides when to evaluate and with what.
"""
from __future__ import annotations

import contextlib
import copy
import resource
import sys
import time
from dataclasses import asdict, dataclass, replace

import torch

from evotrainer.envs import EnvTask
from evotrainer.envs.play import Played, as_generation, play
from evotrainer.evidence import RolloutRecord
from evotrainer.harness import Harness, Rollouts
from evotrainer.harness.filters import DEAD_STD
from evotrainer.harness.losses import LOG_RATIO_CLAMP, POLICY_LOSSES, tis_weights
from evotrainer.harness.rollouts import SlotError
from evotrainer.harness.signal import Signal, harness_signal, trained_rows
from evotrainer.trainer.accumulate import aggregation_weights, chunks
from evotrainer.trainer.distributed import World
from evotrainer.trainer.levels import LevelPicker
from evotrainer.trainer.logprobs import completion_logprobs
from evotrainer.trainer.optim import lr_at, make_adamw, resume_adamw
from evotrainer.policy.adapters import reference, trainable
from evotrainer.policy.config import PolicyConfig
from evotrainer.policy.generate import Generation, concat_generations, decode, generate, select_rows
from evotrainer.policy.prompts import encode_prompts, stop_token_ids
from evotrainer.tasks import Judgement, Task


@dataclass
class StepMetrics:
    step: int
    reward_mean: float
    score_mean: float
    dead_groups: float      # share of groups whose rewards are all equal
    kept_groups: float      # share that passed the group filter
    loss: float
    kl: float
    entropy: float
    mean_logprob: float
    length_mean: float
    truncated: float
    lr: float
    seconds: float
    generate_seconds: float
    # share of policy tokens where PPO's clip changed the loss, and the approximate KL
    # (k3) of the updated policy to the sampling one, over the updates of the step (verl's
    # pg_clipfrac and ppo_kl); both are 0 with num_iterations 1, where every ratio is 1
    clip_frac: float = 0.0
    approx_kl: float = 0.0
    # the training process's peak so far: resident memory, and CUDA memory allocated (0 on a CPU)
    peak_rss_mb: float = 0.0
    peak_gpu_mb: float = 0.0
    # groups sampled in the step: prompts_per_step, and more under dynamic sampling's refill
    # (knob refill_rounds); kept_groups is a share of these, so 1 / kept_groups is the number of
    # groups sampled per group trained
    groups_sampled: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def completion_width(task: Task, knobs) -> int:
    """Tokens a rollout's completion may take: the harness's budget for a single-turn task; for a
    multi-turn task everything after the prompt, so the episode's token cap."""
    return task.caps.max_tokens if isinstance(task, EnvTask) else knobs.completion_budget(task.max_new_tokens)


class GRPOTrainer:
    def __init__(self, model, tok, task: Task, harness: Harness, *, seed: int = 0,
                 policy: PolicyConfig | None = None, micro_batch_size: int = 0, sample_seed: int | None = None,
                 world: World | None = None):
        self.model, self.tok, self.task, self.harness = model, tok, task, harness
        self.policy = policy or PolicyConfig()
        self.micro_batch_size = micro_batch_size
        self.k = k = harness.knobs
        self.seed, self.step_no = seed, 0
        self.steps_before = 0  # steps this policy trained before this trainer (see resume_optimizer)
        self.T = completion_width(task, k)
        self.device = next(model.parameters()).device
        self.stop_ids = stop_token_ids(model, tok)
        # `seed` draws the data (problems, levels); `sample_seed` the sampling: two runs on the
        # same problems with other sampling seeds are what the gate's noise replicas measure
        sample_seed = seed if sample_seed is None else sample_seed
        torch.manual_seed(sample_seed)
        self.levels = LevelPicker(harness, task, seed)
        self.world = world or World()
        # each rank samples its own share of the prompts with a stream of its own
        self.sampler = torch.Generator(device=self.device).manual_seed(sample_seed + self.world.rank)
        self.stream = task.train_stream(seed)
        self.judged: list[Judgement] = []  # the verifier's verdicts on the last sample
        self.played: list[Played] | None = None  # a multi-turn task's episodes of the last sample
        # the KL reference, the starting policy: (model, context to run it in). A LoRA policy's is
        # itself with its adapter disabled or a frozen copy of it (adapters.reference), no second model
        self.ref = None
        if k.kl_coef > 0 and hasattr(model, "peft_config"):
            self.ref = (model, reference(model))
        elif k.kl_coef > 0:
            self.ref = (copy.deepcopy(model).eval().requires_grad_(False), contextlib.nullcontext)
        self.params = trainable(model)
        self.world.same_start(self.params)
        self.opt = make_adamw(model, k)
        # fp16 autocast needs loss scaling, or small gradients underflow to zero
        self.scaler = torch.amp.GradScaler(self.device.type) if self.policy.compute_dtype() == torch.float16 else None
        model.train()

    # -- optimizer state across segments --------------------------------------------------
    def optimizer_state(self) -> dict:
        return {"optimizer": self.opt.state_dict(), "steps": self.steps_before + self.step_no}

    def resume_optimizer(self, state: dict) -> None:
        """AdamW goes on from the segment before (optim.resume_adamw)."""
        self.steps_before = resume_adamw(self.opt, state, self.k)

    # -- one step -----------------------------------------------------------------------
    def sample(self) -> tuple[list, Generation, list[str], torch.Tensor]:
        G = self.k.group_size
        problems = self.stream.batch(self.levels.levels(self.step_no, self.k.prompts_per_step))
        problems = problems[self.world.shard(len(problems))]  # this rank's whole groups (all, in one process)
        if isinstance(self.task, EnvTask):
            return self._play(problems)
        ids, mask = encode_prompts(self.tok, [p.prompt for p in problems], self.policy.chat_template, self.device)
        with self.policy.autocast():
            gen = generate(self.model, ids, mask, max_new_tokens=self.T, stop_ids=self.stop_ids,
                           pad_id=self.tok.pad_token_id, temperature=self.k.temperature, generator=self.sampler,
                           repeats=G, top_k=self.k.top_k, top_p=self.k.top_p)
        rows = [p for p in problems for _ in range(G)]
        texts = decode(self.tok, gen)
        self.judged = self.task.judge_many(rows, texts)  # the evidence keeps what happened to a program
        scores = torch.tensor([j.score for j in self.judged], dtype=torch.float32)
        return rows, gen, texts, scores

    def _play(self, problems) -> tuple[list, Generation, list[str], torch.Tensor]:
        """A multi-turn task's sample: each group plays its problem G times (envs/play.py)."""
        G, k = self.k.group_size, self.k
        rows = [p for p in problems for _ in range(G)]
        envs = [self.task.environment(p, self.harness.action_parser) for p in rows]
        with self.policy.autocast():
            self.played = play(self.model, self.tok, envs, self.task.caps, self.stop_ids, temperature=k.temperature,
                               generator=self.sampler, top_k=k.top_k, top_p=k.top_p,
                               chat_template=self.policy.chat_template)
        gen = as_generation(self.played, self.tok.pad_token_id, self.T, self.device)
        # the evidence keeps the prompt the policy saw (a seeded environment's problem holds only its seed)
        rows = [p if p.prompt == pl.prompt else replace(p, prompt=pl.prompt) for p, pl in zip(rows, self.played)]
        self.judged = [Judgement(p.reward) for p in self.played]
        scores = torch.tensor([p.reward for p in self.played], dtype=torch.float32)
        return rows, gen, [p.transcript() for p in self.played], scores

    def step(self) -> tuple[StepMetrics, list[RolloutRecord]]:
        k, G = self.k, self.k.group_size
        t0 = time.perf_counter()
        self.step_no += 1
        rounds = self._fill()
        t_gen = time.perf_counter() - t0
        lr = lr_at(k, self.steps_before + self.step_no)  # warm-up counts the policy's steps, not this segment's
        for group in self.opt.param_groups:
            group["lr"] = lr
        b, sig, played, mine = join_rounds(rounds, k.prompts_per_step)
        gen = concat_generations([r.gen for r in rounds], self.tok.pad_token_id)
        upd = self._update(gen, sig.advantages[mine].to(self.device),
                           trained_rows(sig.row_keep[mine], gen.truncated.cpu(), k).to(self.device))
        upd = UpdateStats.total(self.world.gather(upd))

        self.levels.observe([p.level for p in b.rows[::G]], b.scores.view(-1, G).mean(1).tolist())
        return finish_step(self.step_no, b.rows, b.texts, scores=b.scores, sig=sig, lengths=b.lengths,
                           truncated=b.truncated, logp_sum=b.logp_sum, entropy_sum=b.entropy_sum, upd=upd, lr=lr,
                           seconds=time.perf_counter() - t0, generate_seconds=t_gen, judged=b.judged, played=played)

    def _fill(self) -> list["Round"]:
        """The step's rounds of sampling: one, and under refill_rounds (DAPO's dynamic sampling)
        more, while fewer than prompts_per_step groups of the rounds so far passed the filter."""
        rounds = [self._round()]
        while len(rounds) <= self.k.refill_rounds and sum(int(r.sig.keep.sum()) for r in rounds) < self.k.prompts_per_step:
            rounds.append(self._round())
        return rounds

    def _round(self) -> "Round":
        """One batch sampled, gathered from every rank, and read by the harness's slots."""
        rows, gen, texts, scores = self.sample()
        # the whole batch on every rank (trainer/distributed.py; one process: its own share, as it is)
        shares = self.world.gather(Share(rows, texts, scores, gen.lengths.cpu(), gen.truncated.cpu(),
                                         gen.logprobs.sum(-1).cpu(), gen.entropy.sum(-1).cpu(), self.judged))
        b = Share.merge(shares)
        ro = Rollouts(b.rows, b.texts, b.scores, b.lengths, b.truncated, self.k.group_size, self.T,
                      *episode_fields(self.played))
        start = sum(len(s.rows) for s in shares[:self.world.rank])
        return Round(b, harness_signal(self.harness, ro), gen, slice(start, start + len(rows)), self.played)

    def _update(self, gen: Generation, adv: torch.Tensor, row_keep: torch.Tensor) -> "UpdateStats":
        """num_iterations optimizer steps on the sampled batch, each accumulated over micro-batches.
        Under data parallelism (self.world) `gen` holds this rank's rows of the batch: each rank's
        loss takes the aggregation's weights over the whole batch, and the ranks sum their
        gradients before every step (trainer/distributed.py)."""
        k, h, world = self.k, self.harness, self.world
        B = adv.shape[0]
        # the mask is as wide as the budget, whatever the longest completion: Dr. GRPO divides by it
        loss_mask = torch.zeros(B, self.T, device=self.device)
        loss_mask[:, :gen.completion_mask.shape[1]] = gen.completion_mask.float() * row_keep[:, None]
        masks = world.gather(loss_mask.cpu()) if world.parallel else [loss_mask]
        start = sum(len(m) for m in masks[:world.rank])
        # The built-in policy losses of a row whose advantage is 0 are exactly 0, and so are
        # their gradients (without KL or entropy terms). Such rows (dead groups, mostly) skip the
        # training forward and backward; their zero per-token loss is put back before
        # aggregation, so every aggregation sees the same batch and the update is unchanged.
        exact_skip = h.policy_loss in ZERO_AT_ZERO_ADVANTAGE and not k.kl_coef and not k.entropy_coef
        selected = high_entropy_tokens(gen.entropy, loss_mask[:, :gen.entropy.shape[1]], k.top_entropy_quantile, world)
        active = (row_keep & (adv != 0)) if exact_skip else row_keep
        parts = chunks(active.nonzero().squeeze(-1), self.micro_batch_size)
        weights = None
        if len(parts) > 1 or world.parallel:
            weights = aggregation_weights(h.loss_agg, torch.cat(masks).to(self.device))[start:start + B]
        old_logp, ref_logp = {}, {}
        stats = UpdateStats()
        kept = any(world.gather(bool(row_keep.any())))  # every rank steps, or none
        for _ in range(k.num_iterations if kept else 0):
            for p in self.params:  # zero, not None: Adam skips params without grads
                p.grad = torch.zeros_like(p) if p.grad is None else p.grad.zero_()
            loss_v = 0.0
            for c, idx in enumerate(parts):
                if not len(idx):
                    continue
                sub = select_rows(gen, idx)
                with self.policy.autocast():
                    logp, ent = completion_logprobs(self.model, sub, k.temperature, with_entropy=bool(k.entropy_coef))
                    if self.ref is not None and c not in ref_logp:
                        ref_model, ref_context = self.ref
                        with torch.no_grad(), ref_context():
                            ref_logp[c] = completion_logprobs(ref_model, sub, k.temperature)[0]
                old = old_logp.setdefault(c, logp.detach())  # the sampling policy (ratio 1 on the first update)
                m = sub.completion_mask.float()
                loss_sub = h.policy_loss(logp, old, adv[idx], m, k)
                if selected is not None:
                    loss_sub = loss_sub * selected[idx, :loss_sub.shape[1]]
                if k.tis_cap:  # the sampler's numbers against the trainer's, before any update
                    loss_sub = loss_sub * tis_weights(old, sub.logprobs, k.tis_cap)
                if c in ref_logp:
                    kl = h.kl_estimator(logp, ref_logp[c])
                    loss_sub = loss_sub + k.kl_coef * kl
                    stats.kl += float((kl.detach() * m).sum())
                if k.entropy_coef:
                    loss_sub = loss_sub - k.entropy_coef * ent
                stats.add_ppo(logp.detach(), old, adv[idx], m, clip_low=k.clip_low, clip_high=k.clip_high)
                T = loss_sub.shape[1]
                if weights is None:  # the whole batch at once: the aggregation sees it as it is
                    loss_tok = torch.zeros(B, self.T, device=self.device, dtype=loss_sub.dtype)
                    loss_tok[idx, :T] = loss_sub
                    loss = h.loss_agg(loss_tok, loss_mask)
                else:
                    loss = (loss_sub * weights[idx, :T]).sum()
                if not torch.isfinite(loss):
                    raise SlotError("loss is not finite")
                (self.scaler.scale(loss) if self.scaler else loss).backward()
                loss_v += float(loss.detach())
            world.sum_gradients(self.params)
            if self.scaler:
                self.scaler.unscale_(self.opt)
            if k.max_grad_norm:
                torch.nn.utils.clip_grad_norm_(self.params, k.max_grad_norm)
            if self.scaler:
                self.scaler.step(self.opt)
                self.scaler.update()
            else:
                self.opt.step()  # zero gradients still step: Adam's momentum moves, as in a full pass
            stats.loss = loss_v  # the last update's
        return stats


ZERO_AT_ZERO_ADVANTAGE = tuple(POLICY_LOSSES.get(n) for n in ("clipped", "gspo", "cispo"))


def high_entropy_tokens(entropy: torch.Tensor, mask: torch.Tensor, quantile: float,
                        world: World) -> torch.Tensor | None:
    """[B, T] float 0/1: the tokens in the loss whose sampling entropy is in the batch's top
    `quantile` (Wang et al. 2506.01939, "Beyond the 80/20 rule": training on the high-entropy
    forks alone); None when the quantile keeps every token. The threshold is the quantile over
    every process's tokens in the loss, as TRL's top_entropy_quantile takes it over its batch."""
    if quantile >= 1:
        return None
    live = mask.bool()
    pool = torch.cat([x.to(entropy.device) for x in world.gather(entropy[live].float().cpu())]) \
        if world.parallel else entropy[live].float()
    if not pool.numel():
        return torch.zeros_like(entropy)
    return ((entropy >= torch.quantile(pool, 1 - quantile)) & live).float()


@dataclass
class UpdateStats:
    """What the updates of one step add up to: sums over the policy tokens of every micro-batch of
    every update (both backends fill one; the step's metrics are these per token)."""
    loss: float = 0.0       # the last update's aggregated loss
    kl: float = 0.0         # KL penalty to the reference policy
    clip: float = 0.0       # tokens where PPO's clip changed the loss
    approx_kl: float = 0.0  # k3 of the updated policy to the sampling one
    tokens: float = 0.0

    def add_ppo(self, logp, old, adv, mask, *, clip_low: float, clip_high: float) -> None:
        """One micro-batch update's clip count, approximate KL and token count."""
        log_ratio = (logp - old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).float()
        ratio = log_ratio.exp()
        a = adv[:, None]
        clipped = (-a * ratio.clamp(1 - clip_low, 1 + clip_high)) > (-a * ratio)
        self.clip += float((clipped.float() * mask).sum())
        self.approx_kl += float(((ratio - 1 - log_ratio) * mask).sum())
        self.tokens += float(mask.sum())

    def per_token(self, total: float) -> float:
        return total / max(self.tokens, 1.0)

    @staticmethod
    def total(parts: list["UpdateStats"]) -> "UpdateStats":
        """The ranks' stats of one step, summed (each rank's loss is its rows' share of the batch's)."""
        if len(parts) == 1:
            return parts[0]
        return UpdateStats(*(sum(getattr(p, f) for p in parts) for f in ("loss", "kl", "clip", "approx_kl", "tokens")))


@dataclass
class Share:
    """One rank's rollouts of a step, as the harness and the evidence read them."""
    rows: list
    texts: list[str]
    scores: torch.Tensor
    lengths: torch.Tensor
    truncated: torch.Tensor
    logp_sum: torch.Tensor     # [B] sums of the sampling policy's token log-probs
    entropy_sum: torch.Tensor  # [B] and of its entropies
    judged: list

    @staticmethod
    def merge(shares: list["Share"]) -> "Share":
        if len(shares) == 1:
            return shares[0]
        return Share(*(sum((getattr(s, f) for s in shares), []) for f in ("rows", "texts")),
                     *(torch.cat([getattr(s, f) for s in shares]) for f in ("scores", "lengths", "truncated",
                                                                           "logp_sum", "entropy_sum")),
                     sum((s.judged for s in shares), []))


@dataclass
class Round:
    """One round of a step's sampling: the whole batch and its signal, this rank's generation
    and where its rows sit in the batch, and a multi-turn task's episodes."""
    batch: Share
    sig: Signal
    gen: Generation
    mine: slice
    played: list[Played] | None


def join_rounds(rounds: list[Round], target: int) -> tuple[Share, Signal, list[Played] | None, torch.Tensor]:
    """A step's rounds as one batch: every rollout stays in the evidence, and of the groups the
    filter passed, the first `target` train (DAPO trims its refilled batch to the batch size).
    Returns the batch, its signal, the episodes and this rank's rows in it."""
    sig = Signal(*(torch.cat([getattr(r.sig, f) for r in rounds]) for f in ("rewards", "keep", "advantages")))
    sig.keep &= sig.keep.cumsum(0) <= target
    offsets = [0] + torch.tensor([len(r.batch.rows) for r in rounds]).cumsum(0).tolist()
    mine = torch.cat([torch.arange(o + r.mine.start, o + r.mine.stop) for o, r in zip(offsets, rounds)])
    played = None if rounds[0].played is None else [p for r in rounds for p in r.played]
    return Share.merge([r.batch for r in rounds]), sig, played, mine


def finish_step(step: int, rows: list, texts: list[str], *, scores: torch.Tensor, sig: Signal, lengths: torch.Tensor,
                truncated: torch.Tensor, logp_sum: torch.Tensor, entropy_sum: torch.Tensor, upd: UpdateStats,
                lr: float, seconds: float, generate_seconds: float, judged: list[Judgement] | None = None,
                played: list[Played] | None = None) -> tuple[StepMetrics, list[RolloutRecord]]:
    """A step's metrics and evidence records, from its rollouts (logp_sum and entropy_sum: [B] sums
    of the sampling policy's per-token log-probs and entropies) and its updates; both backends."""
    G = len(rows) // len(sig.keep)
    n_tok = lengths.clamp(min=1).float()
    seq_logp, seq_ent = logp_sum / n_tok, entropy_sum / n_tok
    dead = sig.rewards.view(-1, G).std(dim=1, unbiased=False) <= DEAD_STD
    m = StepMetrics(
        step=step, reward_mean=float(sig.rewards.mean()), score_mean=float(scores.mean()),
        dead_groups=float(dead.float().mean()), kept_groups=float(sig.keep.float().mean()),
        loss=upd.loss, kl=upd.per_token(upd.kl), entropy=float(seq_ent.mean()), mean_logprob=float(seq_logp.mean()),
        length_mean=float(lengths.float().mean()), truncated=float(truncated.float().mean()),
        lr=lr, seconds=seconds, generate_seconds=generate_seconds,
        clip_frac=upd.per_token(upd.clip), approx_kl=upd.per_token(upd.approx_kl), groups_sampled=len(sig.keep),
        **peak_memory())
    records = rollout_records(step, rows, texts, scores=scores, sig=sig, lengths=lengths, truncated=truncated,
                              seq_logp=seq_logp, seq_ent=seq_ent, judged=judged)
    for r, p in zip(records, played or ()):
        agentic_fields(r, p)
    return m, records


def peak_memory() -> dict:
    """This process's peak resident memory and peak CUDA allocation so far, in MiB."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2 ** 20 if sys.platform == "darwin" else 2 ** 10)
    gpu = torch.cuda.max_memory_allocated() / 2 ** 20 if torch.cuda.is_initialized() else 0.0
    return {"peak_rss_mb": round(rss, 1), "peak_gpu_mb": round(gpu, 1)}


def episode_fields(played: list[Played] | None) -> tuple:
    """Rollouts' multi-turn fields (turns, stops, traces), or Nones for a single-turn task."""
    if played is None:
        return None, None, None
    return torch.tensor([p.turns for p in played]), [p.stop for p in played], [p.trace for p in played]


def agentic_fields(r: RolloutRecord, p: Played) -> None:
    """A multi-turn episode's evidence beside its reward: turns, tools, how it ended, files."""
    t = p.trace
    r.turns, r.tool_calls, r.tool_failures = p.turns, len(t.tools), t.failures
    r.tool_sequence, r.stop, r.terminated = " ".join(t.tools), p.stop, p.terminated
    r.files_read, r.files_edited = " ".join(t.files_read), " ".join(t.files_edited)
    r.target_files, r.tests_run, r.git_access, r.partial = " ".join(t.target_files), t.tests_run, t.git_access, t.partial


def rollout_records(step: int, rows: list, texts: list[str], *, scores: torch.Tensor, sig: Signal,
                    lengths: torch.Tensor, truncated: torch.Tensor, seq_logp: torch.Tensor,
                    seq_ent: torch.Tensor, judged: list[Judgement] | None = None) -> list[RolloutRecord]:
    """One evidence record per rollout of a step (both backends write these)."""
    G = len(rows) // len(sig.keep)
    judged = judged or [Judgement(0.0)] * len(rows)
    return [RolloutRecord(step=step, group_id=i // G, prompt_id=p.id, prompt=p.prompt, answer=p.answer, level=p.level,
                          completion=c, score=s, reward=r, advantage=a, length=n, truncated=tr,
                          mean_logprob=lp, entropy=e, kept=kp, outcome=j.outcome, failure=j.failure)
            for i, (p, c, s, r, a, n, tr, lp, e, kp, j) in enumerate(zip(
                rows, texts, scores.tolist(), sig.rewards.tolist(), sig.advantages.tolist(), lengths.tolist(),
                truncated.tolist(), seq_logp.tolist(), seq_ent.tolist(), sig.row_keep.tolist(), judged))]

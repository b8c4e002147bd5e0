"""The TRL backend: a segment trained by TRL's GRPOTrainer under the same harness.

TRL samples, computes the loss and steps the optimizer; the harness enters at four points:

- prompts: a stream drawn by the harness's curriculum from the task's train stream (an
  IterableDataset read one step at a time), encoded by our prompt encoder, so both
  backends feed the model identical token ids;
- reward: one `reward_funcs` entry that scores the completions with the task's verifier and
  runs the harness's reward, group filter and advantage (harness.signal, as the embedded
  trainer does);
- advantages and group filter: `_generate_and_score_completions` replaces TRL's advantages
  with the harness's and takes dropped groups (and, under mask_truncated, truncated rows)
  out of the loss through TRL's own loss mask (its `tool_mask`) and token count;
- evidence: the loss forward's log-probs and entropies (the sampling policy's, at the first
  update of a batch) fill the same per-rollout records and per-step metrics as the embedded
  trainer writes, through the same SegmentLog.

What TRL cannot express is refused before training (trl_mapping.trl_refusals).

Data parallelism (`data_parallel` N > 1, trainer/distributed.py's processes): TRL runs under
accelerate as N processes, each with a copy of the model and a contiguous 1/N of every
sampled batch's rows, DDP averaging the gradients. Every process reads the whole prompt
stream (TRL's iterable path shards batches, it does not dispatch them), so prompt ids agree;
the reward function gathers the batch's rows from every process and runs the harness's
signal on all of them (a group may straddle two processes), so each process holds the
signal one process would compute and keeps its own rows of it; rank 0 writes the evidence.
"""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
from datasets import IterableDataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from evotrainer.harness.rollouts import Rollouts
from evotrainer.harness.signal import Signal, harness_signal, trained_rows
from evotrainer.trainer.distributed import World
from evotrainer.trainer.grpo import UpdateStats, finish_step
from evotrainer.trainer.levels import LevelPicker
from evotrainer.trainer.optim import lr_at, make_adamw, resume_adamw
from evotrainer.trainer.trl_mapping import LOSS_TYPES, grpo_config_kwargs
from evotrainer.policy.generate import decode_ids
from evotrainer.policy.prompts import prompt_token_ids, stop_token_ids


@dataclass
class Batch:
    """One sampled batch, as the reward function saw it, and what the loss passes add to it."""
    problems: list
    texts: list[str]
    scores: torch.Tensor
    lengths: torch.Tensor
    truncated: torch.Tensor
    signal: Signal
    judged: list                       # the task's Judgements, one per row
    mine: slice                        # this process's rows of the batch (all of them in one process)
    logp_sum: torch.Tensor = None      # [rows of mine] sum of the sampling policy's token log-probs
    entropy_sum: torch.Tensor = None   # [rows of mine] sum of its per-token entropies
    stats: UpdateStats = field(default_factory=UpdateStats)
    started: float = 0.0
    generate_s: float = 0.0


class GatedAdamW(torch.optim.AdamW):
    """AdamW that skips its step on a batch whose every group the harness's filter dropped, as
    the embedded trainer does (TRL would step on the zero gradient and move by momentum)."""
    skip = False

    def step(self, closure=None):
        return None if self.skip else super().step(closure)


class HarnessGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer with the harness's reward, filter, advantage and curriculum."""

    def __init__(self, *args, task, harness, chat_template: bool, seed: int, log, steps_before: int = 0,
                 world: World | None = None, **kwargs):
        self.task, self.harness, self.segment_log = task, harness, log
        self.world = world or World()
        self.evo_chat_template = chat_template  # (TRL sets its own self.chat_template)
        self.level_picker = LevelPicker(harness, task, seed)
        self.stream = task.train_stream(seed)
        self.problems: list = []           # every prompt handed to TRL, by index
        self.rollout_batch: Batch | None = None
        self.batches_done, self.steps_before = 0, steps_before
        self.G = harness.knobs.group_size
        super().__init__(*args, reward_funcs=[self.harness_reward],
                         train_dataset=IterableDataset.from_generator(self._prompts), **kwargs)
        self.stop_ids = stop_token_ids(self.model, self.processing_class)
        self.budget = harness.knobs.completion_budget(task.max_new_tokens)
        self.add_callback(_StepEnd(self))

    # -- prompts --------------------------------------------------------------------------
    def _prompts(self):
        """Endless prompts, prompts_per_step at a time, from the levels the curriculum picks."""
        step = 0
        while True:
            step += 1
            for lv in self.level_picker.levels(step, self.harness.knobs.prompts_per_step):
                self.problems.append(self.stream.draw(lv))
                yield {"prompt": self.problems[-1].prompt, "pid": len(self.problems) - 1}

    def _tokenize_prompts(self, prompts: list):
        return prompt_token_ids(self.processing_class, prompts, self.evo_chat_template), None, {}

    def _generate(self, prompts: list):
        t = time.perf_counter()
        out = super()._generate(prompts)
        self._generate_s = time.perf_counter() - t
        return out

    # -- reward, filter, advantage -------------------------------------------------------
    def harness_reward(self, prompts, completions, completion_ids, pid, **_):
        """TRL's reward function: verifier scores of this process's rows, then the harness's
        signal for the whole batch (every process's rows, gathered); this process's rewards."""
        ended = [bool(ids) and ids[-1] in self.stop_ids for ids in completion_ids]
        texts = decode_ids(self.processing_class, [ids[:-1] if e else ids for ids, e in zip(completion_ids, ended)])
        judged = self.task.judge_many([self.problems[i] for i in pid], texts)
        shares = self.world.gather((list(pid), texts, judged, [len(ids) for ids in completion_ids], ended))
        start = sum(len(share[0]) for share in shares[:self.world.rank])
        pid, texts, judged, lengths, ended = (sum((list(share[i]) for share in shares), []) for i in range(5))
        problems = [self.problems[i] for i in pid]
        scores = torch.tensor([j.score for j in judged], dtype=torch.float32)
        lengths, truncated = torch.tensor(lengths), torch.tensor([not e for e in ended])
        sig = harness_signal(self.harness, Rollouts(problems, texts, scores, lengths, truncated, self.G, self.budget))
        mine = slice(start, start + len(completion_ids))
        self.rollout_batch = Batch(problems, texts, scores, lengths, truncated, sig, judged, mine,
                                   logp_sum=torch.zeros(len(completion_ids)), entropy_sum=torch.zeros(len(completion_ids)),
                                   started=self._batch_start, generate_s=self._generate_s)
        self.level_picker.observe([p.level for p in problems[::self.G]], scores.view(-1, self.G).mean(1).tolist())
        return sig.rewards[mine].tolist()

    def _generate_and_score_completions(self, inputs):
        self._batch_start = getattr(self, "_last_step_end", None) or time.perf_counter()
        out = super()._generate_and_score_completions(inputs)
        b, dev = self.rollout_batch, out["advantages"].device
        trained = trained_rows(b.signal.row_keep, b.truncated, self.harness.knobs)  # filter, mask_truncated
        kept = int(trained.sum())  # over the whole batch: every process steps, or none
        keep = trained[b.mine].to(dev)
        adv = b.signal.advantages[b.mine].to(dev)
        if LOSS_TYPES[self.harness.knobs.loss_agg] != "dapo" and kept:
            # TRL's per-sequence losses average over every row of a micro-batch (and DDP over
            # the processes' equal shares); scaling the advantages by rows / kept rows makes
            # that the mean over kept rows, as ours (every loss form is linear in it)
            adv = adv * (len(trained) / kept)
        out["advantages"] = adv
        out["tool_mask"] = keep[:, None].expand_as(out["completion_mask"]).to(out["completion_mask"].dtype)
        # the token mean's denominator: kept tokens over every process's rows (TRL divides it by
        # the process count, and DDP's average of the processes' gradients makes it whole again)
        out["num_items_in_batch"] = self.accelerator.gather((out["completion_mask"] * out["tool_mask"]).sum()).sum()
        out["row_index"] = torch.arange(len(keep), device=dev)
        getattr(self.optimizer, "optimizer", self.optimizer).skip = not kept  # accelerate wraps it
        return out

    # -- evidence from the loss forward ---------------------------------------------------
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        S = self.args.steps_per_generation
        self._micro = inputs
        self._first_update = (self._step % (S * self.num_iterations)) // S == 0
        if self._step % S == 0:
            self.rollout_batch.stats.loss = 0.0  # the reported loss is the last update's
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        self.rollout_batch.stats.loss += float(loss.detach())
        return loss

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        logps, entropies, aux = super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
        if kwargs.get("compute_entropy") and self.model.training:  # the loss forward of a micro-batch
            self._record_micro(logps.detach().float(), entropies.detach().float())
        return logps, entropies, aux

    def _record_micro(self, logps, entropies) -> None:
        x, b, k = self._micro, self.rollout_batch, self.harness.knobs
        rows = x["row_index"].cpu()
        seq_mask = x["completion_mask"].float()
        if self._first_update:  # the sampling policy's own log-probs: the evidence records'
            b.logp_sum[rows] = (logps * seq_mask).sum(-1).cpu()
            b.entropy_sum[rows] = (entropies * seq_mask).sum(-1).cpu()
        loss_mask = seq_mask * x["tool_mask"].float()
        old = x.get("old_per_token_logps")
        b.stats.add_ppo(logps, logps if old is None else old.float(), x["advantages"].float(), loss_mask,
                        clip_low=k.clip_low, clip_high=k.clip_high)
        ref = x.get("ref_per_token_logps")
        if ref is not None:  # TRL's penalty is k3, the harness's estimator (trl_refusals)
            b.stats.kl += float((self.harness.kl_estimator(logps, ref.float()) * loss_mask).sum())

    # -- one sampled batch done -----------------------------------------------------------
    def batch_done(self) -> None:
        """After the last optimizer step on a batch: its metrics and records, as the embedded trainer's."""
        b, world = self.rollout_batch, self.world
        self.batches_done += 1
        now = time.perf_counter()
        logp, entropy = (torch.cat(world.gather(x)) for x in (b.logp_sum, b.entropy_sum))
        stats = UpdateStats.total(world.gather(b.stats))
        stats.loss /= world.size  # each process's loss is its share's; DDP trains on their mean
        m, recs = finish_step(self.batches_done, b.problems, b.texts, scores=b.scores, sig=b.signal, lengths=b.lengths,
                              truncated=b.truncated, logp_sum=logp, entropy_sum=entropy, upd=stats,
                              lr=lr_at(self.harness.knobs, self.steps_before + self.batches_done),
                              seconds=now - b.started, generate_seconds=b.generate_s, judged=b.judged)
        if self.segment_log is None:  # a data-parallel process past the first records nothing
            self._last_step_end = now
            return
        self.segment_log.record(m.to_dict(), recs, self.model, self.processing_class)
        if self.args.report_to and self.args.report_to != ["none"]:
            # to the trackers TRL was given: our step's metrics beside TRL's own averages (TRL's
            # `log` adds those and empties them); the Trainer's own logging never fires
            self.log({f"evotrainer/{k}": v for k, v in m.to_dict().items() if k != "step"
                      and isinstance(v, (int, float)) and not isinstance(v, bool)})
        for values in self._metrics["train"].values():  # TRL's own metrics: logged above or nowhere
            values.clear()
        self._last_step_end = now


class _StepEnd(TrainerCallback):
    """Every num_iterations optimizer steps, one sampled batch is done."""

    def __init__(self, trainer: HarnessGRPOTrainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.trainer.num_iterations == 0:
            self.trainer.batch_done()


def tracker_files(report_to, out: Path) -> None:
    """Where the trackers' Trainer callbacks write in this worker: inside its train directory
    (the only place a sandboxed job may write), offline. This process is the job's own, so
    the libraries' documented variables are set here, never in the user's shell."""
    out.mkdir(parents=True, exist_ok=True)
    if "wandb" in report_to:
        os.environ.setdefault("WANDB_MODE", "offline")
        os.environ.setdefault("WANDB_DIR", str(out))
    if "mlflow" in report_to:
        os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{(out / 'mlflow.db').resolve()}")
    if "trackio" in report_to:
        os.environ.setdefault("TRACKIO_DIR", str(out / "trackio"))


def accelerate_world(world: World) -> None:
    """Tell accelerate (which TRL's Trainer builds) this process's place among the segment's
    processes, the way `accelerate launch` would: the process group is already joined
    (distributed.join), so accelerate adopts it; OMP_NUM_THREADS keeps the threads the job
    chose (unset, accelerate resets them to cores / processes). This process is the job's own."""
    if not world.parallel:
        return
    os.environ.update(RANK=str(world.rank), LOCAL_RANK=str(world.rank), WORLD_SIZE=str(world.size),
                      LOCAL_WORLD_SIZE=str(world.size), OMP_NUM_THREADS=str(torch.get_num_threads()))


def run_trl(model, tok, task, harness, *, seed: int, steps: int, log, optimizer_state: dict | None,
            runtime, sample_seed: int | None = None, world: World | None = None) -> dict:
    """Backend entry point (backends.py): train `steps` sampled batches with TRL."""
    import transformers
    k, world = harness.knobs, world or World()
    transformers.logging.set_verbosity_error()
    accelerate_world(world)
    if log is not None:
        out = log.out_dir / "trl"
        tracker_files(runtime.report_to, out)
    else:  # a data-parallel process past the first: TRL saves and logs on the first only
        out = Path(tempfile.gettempdir(), f"evotrainer-trl-rank-{world.rank}")
    # TRL's seed drives its sampling (each process its own stream, as the embedded trainer's
    # ranks); our level picker and stream draw the data from `seed`
    sampling = (seed if sample_seed is None else sample_seed) + world.rank
    kwargs = grpo_config_kwargs(k, runtime, task_budget=task.max_new_tokens, seed=sampling, steps=steps,
                                output_dir=str(out))
    if "activation_checkpointing" in {f.name for f in fields(GRPOConfig)}:  # transformers 5's name
        kwargs["activation_checkpointing"] = kwargs.pop("gradient_checkpointing")
    config = GRPOConfig(**kwargs)
    opt = make_adamw(model, k, GatedAdamW)
    steps_before = resume_adamw(opt, optimizer_state, k) if optimizer_state is not None else 0
    # the learning rate of each optimizer step: num_iterations steps share one sampled batch
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_at(k, steps_before + s // k.num_iterations + 1) / k.lr)
    trainer = HarnessGRPOTrainer(model=model, args=config, processing_class=tok, optimizers=(opt, sched),
                                 task=task, harness=harness, chat_template=runtime.policy.chat_template, seed=seed,
                                 log=log, steps_before=steps_before, world=world)
    trainer.remove_callback(transformers.PrinterCallback)
    trainer.train()
    return {"optimizer": opt.state_dict(), "steps": steps_before + steps}

"""Evidence from a TRL GRPOTrainer run that evotrainer did not start.

Add the callback to your own trainer; afterwards `evotrainer diagnose DIR`, `evotrainer
backtest --evidence DIR --harness H` and `evotrainer report DIR` read DIR as they read a
train directory of their own:

    from evotrainer.integrations.trl import EvidenceCallback

    trainer = GRPOTrainer(model=model, reward_funcs=[correct, format_bonus], args=args, train_dataset=ds)
    trainer.add_callback(EvidenceCallback(trainer, "runs/mine", score="correct"))
    trainer.train()

`score` names the reward function that is the verifier: whether the answer is right, the
quantity a reward hack does not move. The reward is what TRL optimised, every function
weighted as TRL weighs it (`reward_weights`); with one reward function it is both. Keeping
the two apart is what lets the behaviour layer see a reward that rises while the score does
not (`reward_score_divergence`) or a reward that pays for length (`reward_length_coupling`).

What DIR receives, per sampled batch (one evidence step per generation):

    evidence.jsonl  per completion: prompt, completion, the dataset row's `answer_column`,
                    score, reward, TRL's advantage, length in tokens, truncation (no end token
                    within max_completion_length), and the mean log-prob and entropy of its
                    tokens from the loss forward of the batch's first update (the sampling
                    policy's, as evotrainer's trainer records them)
    metrics.jsonl   TRL's logged metrics at each logging step (kl, entropy, loss, rewards/...)
    run.json        group size (num_generations), token budget, the reward functions, the model

TRL has no public per-rollout hook, so this wraps three methods of the one trainer it is given
(the batch's generation and scoring, the loss, the loss's log-prob forward), as evotrainer's own
TRL backend subclasses them, for the TRL release in evotrainer's `trl` extra; a TRL without
them is refused with one line naming that range. The trainer's training is unchanged: the
wrappers read what TRL computed and return it as it was, one key added (a row index) that
TRL's batch splitting carries along and its loss never reads.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import TrainerCallback

from evotrainer.errors import UsageError
from evotrainer.evidence.records import EvidenceWriter, RolloutRecord
from evotrainer.evidence.external import prompt_id
from evotrainer.envs.foreign import text_of

HOOKS = ("_generate_and_score_completions", "_compute_loss", "_get_per_token_logps_and_entropies", "_logs")
SUPPORTED = "trl>=1.16,<1.17"  # as pyproject's `trl` extra


class EvidenceCallback(TrainerCallback):
    def __init__(self, trainer, out_dir: str | Path, score: str | None = None, answer_column: str = "answer"):
        missing = [h for h in HOOKS if not hasattr(trainer, h)]
        if missing:
            raise UsageError(f"this TRL GRPOTrainer lacks {', '.join(missing)}; EvidenceCallback reads "
                             f"{SUPPORTED}")
        names = list(trainer.reward_func_names)
        if score is None and len(names) > 1:
            raise UsageError(f"score: name the reward function that is the verifier, one of {', '.join(names)}")
        if score is not None and score not in names:
            raise UsageError(f"score '{score}' is not one of the trainer's reward functions: {', '.join(names)}")
        self.trainer, self.out = trainer, Path(out_dir)
        self.score_index = names.index(score) if score else 0
        self.answer_column = answer_column
        self.main = trainer.accelerator.is_main_process
        self.pending: dict | None = None  # the batch sampled last, until its first update fills log-probs
        self.micro: dict | None = None
        self.writer = self.metrics = None
        if self.main:
            self.out.mkdir(parents=True, exist_ok=True)
            self.writer = EvidenceWriter(self.out / "evidence.jsonl")
            self.metrics = open(self.out / "metrics.jsonl", "a", encoding="utf-8")
            (self.out / "run.json").write_text(json.dumps({
                "source": "trl", "group_size": trainer.num_generations,
                "max_new_tokens": trainer.max_completion_length, "reward_funcs": names, "score": names[self.score_index],
                "reward_weights": trainer.reward_weights.tolist(),
                "model": getattr(trainer.model.config, "_name_or_path", "")}, indent=2))
        self._wrap(trainer)

    # -- the three wrapped methods: read, never change, what TRL computed ----------------
    def _wrap(self, t) -> None:
        generate, loss, forward = t._generate_and_score_completions, t._compute_loss, t._get_per_token_logps_and_entropies

        def generate_and_score(inputs):
            out = generate(inputs)
            if t.model.training:
                self._flush()
                self._sampled(inputs, out)
                out["row_index"] = torch.arange(out["completion_ids"].size(0), device=out["completion_ids"].device)
            return out

        def compute_loss(model, inputs):
            self.micro = inputs
            try:
                return loss(model, inputs)
            finally:
                self.micro = None

        def logps_and_entropies(*args, **kwargs):
            logps, entropies, *rest = forward(*args, **kwargs)
            if self.micro is not None and kwargs.get("compute_entropy") and self.pending and not self.pending["filled"]:
                self._update(logps.detach().float(), entropies.detach().float())
            return (logps, entropies, *rest)

        t._generate_and_score_completions, t._compute_loss = generate_and_score, compute_loss
        t._get_per_token_logps_and_entropies = logps_and_entropies

    def _sampled(self, inputs: list[dict], out: dict) -> None:
        """A batch TRL just sampled and scored: what it logged of it, and its token counts."""
        t = self.trainer
        from accelerate.utils import gather_object
        ids, mask = out["completion_ids"], out["completion_mask"]
        lengths = mask.sum(1)
        last = ids.gather(1, (lengths - 1).clamp(min=0)[:, None])[:, 0]
        ended = torch.isin(last, torch.tensor(t.eos_token_ids, device=ids.device)) & (lengths > 0)
        n = len(gather_object([0] * ids.size(0)))  # rows of the batch over every process
        logs = t._logs
        tail = lambda d: list(d)[-n:]  # noqa: E731  (TRL's deques hold the latest batch at their end)
        rewards = torch.tensor([tail(logs["rewards"][name]) for name in t.reward_func_names], dtype=torch.float32).T
        self.pending = {
            "step": t.state.global_step + 1, "prompts": tail(logs["prompt"]), "completions": tail(logs["completion"]),
            "score": rewards[:, self.score_index].nan_to_num(0.0).tolist(),
            "reward": (rewards.nan_to_num(0.0) * t.reward_weights.detach().float().cpu()).sum(1).tolist(),
            "advantage": tail(logs["advantages"]),
            "answers": gather_object([str(x.get(self.answer_column, "")) for x in inputs]),
            "lengths": lengths, "ended": ended, "mask": mask.float(),
            "logp": torch.zeros(ids.size(0)), "entropy": torch.zeros(ids.size(0)), "filled": False, "seen": set()}

    def _update(self, logps: torch.Tensor, entropies: torch.Tensor) -> None:
        """One micro-batch's loss forward: the sampling policy's log-probs while the batch is
        still unchanged by any update (its first pass), summed per row."""
        p, rows = self.pending, self.micro["row_index"].cpu()
        m = self.micro["completion_mask"].float()
        p["logp"][rows] = (logps * m).sum(-1).cpu()
        p["entropy"][rows] = (entropies * m).sum(-1).cpu()
        p["seen"].update(rows.tolist())
        p["filled"] = len(p["seen"]) == p["logp"].numel()

    def _flush(self) -> None:
        """Write the pending batch's records (every process's rows, from the main process)."""
        p, t = self.pending, self.trainer
        if p is None:
            return
        self.pending = None
        acc = t.accelerator
        lengths = acc.gather(p["lengths"]).cpu()
        ended = acc.gather(p["ended"]).cpu()
        known = p["filled"]  # a batch cut short before its first update has no log-probs
        logp, entropy = (acc.gather(x.to(p["lengths"].device)).cpu() for x in (p["logp"], p["entropy"]))
        if not self.main:
            return
        G = t.num_generations
        recs = []
        for i in range(len(p["prompts"])):
            n = max(int(lengths[i]), 1)
            prompt = text_of(p["prompts"][i])
            recs.append(RolloutRecord(
                step=p["step"], group_id=i // G, prompt_id=prompt_id(prompt), prompt=prompt, answer=p["answers"][i],
                level=0, completion=text_of(p["completions"][i]), score=float(p["score"][i]),
                reward=float(p["reward"][i]), advantage=float(p["advantage"][i]), length=int(lengths[i]),
                truncated=not bool(ended[i]), mean_logprob=float(logp[i]) / n if known else None,
                entropy=float(entropy[i]) / n if known else None, kept=True))
        self.writer.write(recs)

    # -- TrainerCallback ----------------------------------------------------------------
    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.main and logs:
            row = {"step": state.global_step} | {k: v for k, v in logs.items()
                                                  if isinstance(v, (int, float)) and not isinstance(v, bool)}
            self.metrics.write(json.dumps(row) + "\n")
            self.metrics.flush()

    def on_train_end(self, args, state, control, **kwargs):
        self._flush()
        if self.main:
            self.writer.close()
            self.metrics.close()

"""What the trainer benchmarks share: plain TRL set up as the peer, step clocks, the policy.

Plain TRL is TRL's GRPOTrainer as a user would run it on the same task: its own prompt
handling (plain text; the tokenizer adds its <bos>), a reward function returning the
verifier's score, loss_type="dapo" (token mean over the batch, as our reference
`token_mean`), scale_rewards="group" (GRPO's std-normalised advantages), beta 0 (no
reference model), fp32 (bf16 off), gradient checkpointing off (TRL's default is on),
transformers generate (no vLLM), constant lr 3e-4, AdamW betas (0.9, 0.99), grad-norm clip
1.0: the reference recipe.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_var, "1")  # before transformers and TRL load: nothing is downloaded

from evotrainer.trainer.segment import SegmentLog  # noqa: E402


class StampLog(SegmentLog):
    """A SegmentLog that also stamps the wall clock at the end of every step."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ends: list[float] = []

    def record(self, *args, **kwargs):
        super().record(*args, **kwargs)
        self.ends.append(time.perf_counter())


def steady_rate(ends: list[float], warmup: int) -> float:
    """Steps per second between the end of the last warm-up step and the end of the last step."""
    ends = ends[warmup - 1:]
    return (len(ends) - 1) / (ends[-1] - ends[0])


def plain_trl(policy_dir: Path, task, prompts: int, group: int, steps: int, seed: int, out_dir: Path,
              device: str = "cpu", bf16: bool = False, save_at: tuple[int, ...] = ()):
    """TRL's GRPOTrainer on the task, configured as the reference recipe; returns (trainer, clock)
    where clock.ends holds the wall time at the end of each optimizer step, clock.scores the mean
    verifier score of each step's rollouts, and the model is saved to out_dir/checkpoints/step-N
    at each step of `save_at`."""
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    problems = task.train_stream(seed).batch([task.target_level] * (prompts * steps))
    by_prompt = {p.prompt: p for p in problems}
    dataset = Dataset.from_dict({"prompt": list(by_prompt)})

    class StepClock(TrainerCallback):
        def __init__(self):
            self.ends, self.scores = [], []

        def on_step_end(self, args, state, control, model=None, processing_class=None, **__):
            self.ends.append(time.perf_counter())
            if state.global_step in save_at:
                model.save_pretrained(out_dir / "checkpoints" / f"step-{state.global_step}")
                processing_class.save_pretrained(out_dir / "checkpoints" / f"step-{state.global_step}")

    clock = StepClock()

    def verifier_score(prompts, completions, **_):
        scores = [task.score(by_prompt[p], c) for p, c in zip(prompts, completions)]
        clock.scores.append(sum(scores) / len(scores))
        return scores

    B = prompts * group
    config = GRPOConfig(
        output_dir=str(out_dir), use_cpu=device == "cpu", bf16=bf16, gradient_checkpointing=False,
        per_device_train_batch_size=B, gradient_accumulation_steps=1, steps_per_generation=1,
        num_generations=group, num_iterations=1, max_steps=steps,
        max_completion_length=task.max_new_tokens, temperature=1.0, top_p=1.0, top_k=0,
        beta=0.0, loss_type="dapo", epsilon=0.2, scale_rewards="group",
        learning_rate=3e-4, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.99, max_grad_norm=1.0,
        use_vllm=False, log_completions=False, report_to="none", save_strategy="no",
        eval_strategy="no", logging_steps=10**9, disable_tqdm=True, seed=seed, data_seed=seed,
        dataloader_pin_memory=False,
    )
    trainer = GRPOTrainer(model=str(policy_dir), reward_funcs=verifier_score, args=config,
                          train_dataset=dataset, callbacks=[clock])
    trainer.remove_callback(PrinterCallback)  # no end-of-training metrics dump
    return trainer, clock


def reference_harness(dest: Path, prompts: int, group: int, **knobs) -> Path:
    """The reference harness at this batch shape, written to dest."""
    import shutil

    import yaml

    from evotrainer.harness import REFERENCE
    shutil.copytree(REFERENCE, dest, dirs_exist_ok=True)
    raw = yaml.safe_load((dest / "knobs.yaml").read_text())
    raw.update(prompts_per_step=prompts, group_size=group, **knobs)
    (dest / "knobs.yaml").write_text(yaml.safe_dump(raw))
    return dest

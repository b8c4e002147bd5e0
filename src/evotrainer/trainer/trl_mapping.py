"""A harness's knobs as TRL's GRPOConfig, and what TRL cannot express (pure: imports no TRL).

The reward, group-filter, advantage and curriculum slots work with any TRL run: the reward
becomes a `reward_funcs` entry, the filter and advantage act through one subclass hook,
the curriculum feeds the prompt stream. The loss is TRL's own, so its form and aggregation
must be one TRL has:

| loss_agg                 | TRL loss_type | what it is                          |
|--------------------------|---------------|-------------------------------------|
| token_mean               | dapo          | token mean over the batch (DAPO)    |
| seq_mean_token_mean      | grpo          | mean per sequence, then over them   |
| seq_mean_token_sum_norm  | dr_grpo       | sum / (rows x completion budget)    |

| knob                        | TRL                                                              |
|-----------------------------|------------------------------------------------------------------|
| policy_loss: clipped        | the loss type above, importance_sampling_level "token"           |
| policy_loss: gspo           | the loss type above, importance_sampling_level "sequence"        |
| policy_loss: cispo          | loss_type "cispo" (token_mean only), epsilon_high 1 + clip_high  |
| clip_low, clip_high         | epsilon, epsilon_high                                            |
| clip_delta                  | delta (None when 0)                                              |
| top_entropy_quantile        | top_entropy_quantile (one micro-batch: TRL takes it per forward) |
| tis_cap                     | vLLM importance-sampling correction, token_truncate, clip_max    |
| mask_truncated              | the loss mask the group filter uses (see below)                  |

mask_truncated is TRL's `mask_truncated_completions` in what it trains, but that flag also
takes the rows out of the attention mask, so their log-probs (the evidence's) would be read
from garbled forwards; the backend takes truncated rows out through the same loss mask as a
dropped group's instead. TRL corrects only a vLLM sampler: tis_cap needs use_vllm there.

KL is TRL's `beta` with its k3 estimator (k2 is refused by name). The entropy bonus is TRL's
`entropy_coef`, a token mean whatever the loss type, taken per micro-batch: the mean of the
micro-batches' token means, where ours is one token mean over the whole batch (accumulate.py).
So it is the same term as ours only under token_mean and with the batch in one micro-batch;
anything else is refused.
"""
from __future__ import annotations

LOSS_TYPES = {"token_mean": "dapo", "seq_mean_token_mean": "grpo", "seq_mean_token_sum_norm": "dr_grpo"}
POLICY_LOSSES = ("clipped", "gspo", "cispo")
# TRL's own reward scaling, for its logs only: the advantage slot's values replace TRL's advantages
SCALE_REWARDS = {"grpo": "group", "dr_grpo": "none", "rloo": "none"}


def trl_refusals(knobs, runtime) -> list[str]:
    """What this harness asks for that TRL's GRPOTrainer cannot do, each with what would work."""
    out = []
    if knobs.policy_loss not in POLICY_LOSSES:
        out.append(f"policy_loss '{knobs.policy_loss}': TRL runs its own loss forms; use policy_loss: "
                   + ", ".join(POLICY_LOSSES) + ", or backend: embedded for a custom loss form")
    if knobs.policy_loss == "cispo" and knobs.loss_agg != "token_mean":
        out.append(f"policy_loss 'cispo' under loss_agg {knobs.loss_agg}: TRL's cispo is a token mean; "
                   "use loss_agg: token_mean, or backend: embedded")
    if knobs.refill_rounds:
        out.append(f"refill_rounds {knobs.refill_rounds}: TRL samples one batch a step and cannot refill it "
                   "(DAPO's dynamic sampling); use refill_rounds: 0, or backend: embedded")
    if knobs.tis_cap and not runtime.use_vllm:
        out.append("tis_cap > 0 without use_vllm: TRL corrects only a vLLM sampler's log-probs; "
                   "use use_vllm: true, tis_cap: 0, or backend: embedded")
    if knobs.top_entropy_quantile < 1 and knobs.entropy_coef:
        out.append("top_entropy_quantile < 1 with entropy_coef > 0: TRL's entropy bonus averages over the selected "
                   "tokens only, ours over every token; use entropy_coef: 0, or backend: embedded")
    if knobs.loss_agg not in LOSS_TYPES:
        out.append(f"loss_agg '{knobs.loss_agg}' has no TRL loss_type; use "
                   + ", ".join(f"{a} ({t})" for a, t in LOSS_TYPES.items()) + ", or backend: embedded")
    if knobs.kl_coef and knobs.kl_estimator != "k3":
        out.append(f"kl_estimator '{knobs.kl_estimator}': TRL's KL penalty (beta) is the k3 estimator; "
                   "use kl_estimator: k3, kl_coef: 0, or backend: embedded")
    if knobs.kl_coef and knobs.group_filter != "keep_all" and knobs.loss_agg != "token_mean":
        out.append(f"group_filter '{knobs.group_filter}' with kl_coef > 0 under loss_agg {knobs.loss_agg}: TRL "
                   "averages its KL term over dropped rows too; use loss_agg: token_mean, kl_coef: 0 or keep_all")
    if knobs.entropy_coef and knobs.loss_agg != "token_mean":
        out.append(f"entropy_coef > 0 under loss_agg {knobs.loss_agg}: TRL's entropy bonus is a token mean "
                   "whatever the loss type; use loss_agg: token_mean, entropy_coef: 0, or backend: embedded")
    batch = knobs.prompts_per_step * knobs.group_size
    processes = runtime.data_parallel
    if batch % processes:
        out.append(f"data_parallel {processes} does not divide the batch of {batch} rollouts (prompts_per_step x "
                   "group_size; each process takes an equal share); pick a divisor of it")
        return out
    if knobs.entropy_coef and processes > 1:
        out.append(f"entropy_coef > 0 with data_parallel {processes}: TRL averages its entropy bonus per process, "
                   "ours over the whole batch; use entropy_coef: 0, data_parallel: 1, or backend: embedded")
    rows = batch // processes  # one process's share
    if knobs.top_entropy_quantile < 1 and 0 < runtime.micro_batch_size < rows:
        out.append(f"top_entropy_quantile < 1 with micro_batch_size {runtime.micro_batch_size}: TRL picks the "
                   "high-entropy tokens per micro-batch, ours over the whole batch; use micro_batch_size: 0, "
                   "or backend: embedded")
    if knobs.entropy_coef and 0 < runtime.micro_batch_size < batch:
        # micro-batches hold different numbers of tokens, so a mean of their means is not the batch's
        out.append(f"entropy_coef > 0 with micro_batch_size {runtime.micro_batch_size} (of a batch of {batch} "
                   "rollouts): TRL averages its entropy bonus per micro-batch, ours over the whole batch; use "
                   "micro_batch_size: 0, entropy_coef: 0, or backend: embedded")
    if runtime.micro_batch_size and rows % runtime.micro_batch_size:
        share = f"a process's {rows} of the batch's {batch} rollouts" if processes > 1 else f"the batch of {batch} rollouts"
        out.append(f"micro_batch_size {runtime.micro_batch_size} does not divide {share} "
                   "(TRL accumulates whole micro-batches); pick a divisor of it")
    return out


def grpo_config_kwargs(knobs, runtime, *, task_budget: int, seed: int, steps: int, output_dir: str) -> dict:
    """GRPOConfig arguments that train like the embedded trainer under the same harness: one
    generation of prompts_per_step x group_size rollouts per sampled batch, num_iterations
    optimizer steps on it (TRL counts each as a step), micro-batches accumulated; under
    data_parallel, each process's share of the rows in its own micro-batches."""
    rows = knobs.prompts_per_step * knobs.group_size // runtime.data_parallel
    micro = runtime.micro_batch_size or rows
    accum = rows // micro
    device = runtime.policy.resolved_device()
    dtype = runtime.policy.compute_dtype()
    loss_type = "cispo" if knobs.policy_loss == "cispo" else LOSS_TYPES[knobs.loss_agg]
    return dict(
        output_dir=output_dir, seed=seed, data_seed=seed, max_steps=steps * knobs.num_iterations,
        use_cpu=device.type == "cpu",
        # on a CPU TRL's default bf16 autocast only slows a run down: the run's dtype decides
        bf16=str(dtype) == "torch.bfloat16", fp16=str(dtype) == "torch.float16",
        gradient_checkpointing=runtime.gradient_checkpointing,
        per_device_train_batch_size=micro, gradient_accumulation_steps=accum, steps_per_generation=accum,
        num_generations=knobs.group_size, num_iterations=knobs.num_iterations,
        max_completion_length=knobs.completion_budget(task_budget),
        temperature=knobs.temperature, top_p=knobs.top_p, top_k=knobs.top_k,
        learning_rate=knobs.lr, adam_beta1=knobs.adam_beta1, adam_beta2=knobs.adam_beta2,
        weight_decay=knobs.weight_decay, max_grad_norm=knobs.max_grad_norm,
        beta=knobs.kl_coef, epsilon=knobs.clip_low,
        epsilon_high=1 + knobs.clip_high if loss_type == "cispo" else knobs.clip_high,
        delta=knobs.clip_delta or None, top_entropy_quantile=knobs.top_entropy_quantile,
        importance_sampling_level="sequence" if knobs.policy_loss == "gspo" else "token",
        vllm_importance_sampling_correction=bool(knobs.tis_cap), vllm_importance_sampling_mode="token_truncate",
        vllm_importance_sampling_clip_max=knobs.tis_cap or None,
        loss_type=loss_type, scale_rewards=SCALE_REWARDS.get(knobs.advantage, "none"),
        entropy_coef=knobs.entropy_coef,
        use_vllm=runtime.use_vllm, vllm_mode=runtime.vllm_mode,
        shuffle_dataset=False,  # the stream is already random, and a shuffle buffer would read ahead of the curriculum
        # the run's trackers (tracking.report_to): the trainer logs once per sampled batch itself
        report_to=list(runtime.report_to) or "none", save_strategy="no", eval_strategy="no", logging_steps=10**9, disable_tqdm=True,
        log_completions=False, dataloader_pin_memory=False,
    )

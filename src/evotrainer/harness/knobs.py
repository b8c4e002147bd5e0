"""Knobs: the scalar settings of a harness, loaded from its `knobs.yaml`.

Parameters (the defaults are the reference recipe):
    reward: reward function name (`binary`; `partial_credit`; or one the harness defines).
    group_filter: which groups enter the gradient (`keep_all`, `drop_dead`, `score_spread`).
    refill_rounds: dynamic sampling with refill (DAPO 2503.14476): while fewer than
        prompts_per_step groups of the step passed the group filter, sample up to this many
        more rounds of prompts_per_step groups, and train on the first prompts_per_step groups
        kept (0: no refill; DAPO's max_num_gen_batches). A round costs a batch's sampling, so a
        step may sample up to 1 + refill_rounds batches; metrics record the groups sampled. With
        keep_all nothing is dropped and nothing refills. TRL has no refill (embedded only).
    advantage: `grpo` (normalised by group std, DeepSeekMath 2402.03300), `dr_grpo`
        (no std division, 2503.20783), `rloo` (leave-one-out baseline, 2402.14740).
    policy_loss: loss form (harness/losses.py): `clipped`, the PPO/GRPO clipped surrogate
        per token; `gspo`, one clipped ratio per sequence (GSPO 2507.18071); `cispo`, REINFORCE
        weighted by a clipped, stop-gradient ratio (MiniMax-M1 2506.13585).
    loss_agg: `token_mean` (DAPO 2503.14476), `seq_mean_token_mean` (GRPO),
        `seq_mean_token_sum`, `seq_mean_token_sum_norm` (Dr. GRPO).
    curriculum: level sampling (`fixed`, `frontier`).
    action_parser: how a multi-turn task reads a policy turn as a tool call (`plain`:
        `name arg|arg`, for the built-in character model; `json`: a JSON tool call, bare or in
        <tool_call> tags, for chat models; or one the harness defines). Unused by single-turn tasks.
    train_levels: levels the curriculum draws from; empty means the task's target level.
    lr: AdamW learning rate. The reference uses 3e-4; 1e-3 collapses the tiny policy
        within a few steps (2 seeds, 3-digit base).
    warmup_steps: linear learning-rate warm-up from 0.
    steps: training steps (one batch of prompts x group_size rollouts per step).
    prompts_per_step: prompt groups per step.
    group_size: rollouts per prompt (GRPO's G).
    temperature: sampling temperature; log-probs in the loss use the same temperature.
    top_k: sample only from the k most likely tokens (0: all), after the temperature.
    top_p: nucleus sampling (Holtzman et al. 1904.09751): sample from the smallest set of
        tokens whose probability reaches top_p (1.0: all). As in TRL and verl, the loss's
        log-probs use the temperature only, so top-k/top-p make sampling slightly off-policy.
    max_new_tokens: completion budget; 0 means the task's own budget, which is also the
        ceiling (a harness may truncate below it, never raise it: a truncation rule).
    clip_low / clip_high: ratio bounds 1 - clip_low, 1 + clip_high (PPO 1707.06347;
        clip_high > clip_low is DAPO's clip-higher).
    clip_delta: two-sided clipping (INTELLECT-2 2505.07291): with a negative advantage the
        ratio is capped at clip_delta, so a token the update already made far likelier gets a
        bounded push down (0: off; else above 1 + clip_high; the report uses 4). TRL's `delta`.
    mask_truncated: completions cut at the token budget leave the loss (DAPO 2503.14476's
        overlong filtering): their missing answer is the budget's fault, not the tokens'.
        TRL's `mask_truncated_completions`.
    top_entropy_quantile: train on the highest-entropy share of the batch's tokens only (Wang
        et al. 2506.01939, "Beyond the 80/20 rule": 0.2); 1.0 keeps every token. TRL's knob
        of the same name.
    tis_cap: truncated importance sampling against the sampler (Yao et al., "Your efficient
        RL framework secretly brings you off-policy RL training", 2025): every token's loss is
        weighted by min(pi_train / pi_sampler, tis_cap), the correction for a sampler whose
        numbers differ from the trainer's (vLLM, or bf16 sampling); 0 disables it. TRL's
        vLLM importance-sampling correction (token_truncate, clip_max).
    num_iterations: gradient updates per sampled batch (GRPO's mu); with 1 the ratio is 1.
    kl_coef: weight of the KL penalty to the frozen starting policy (0 disables it and
        skips the reference forward pass).
    kl_estimator: the per-token KL term added to the loss (Schulman, "Approximating KL
        divergence", 2020; verl's kl_penalty): `k3` (default, GRPO's and TRL's; its gradient
        on-policy is that of KL(ref || pi)), `k2` (0.5 (log pi - log pi_ref)^2; its gradient
        on-policy is exactly that of KL(pi || ref)). `k1` (log pi - log pi_ref) is refused
        with kl_coef > 0: its expected gradient on-policy is E[grad log pi] = 0, so as a loss
        term it is noise, not a penalty (Tang & Munos 2506.09477).
    entropy_coef: weight of an entropy bonus (subtracted from the loss).
    max_grad_norm: gradient clipping norm (0 disables).
    weight_decay, adam_beta1, adam_beta2: AdamW settings.

Every knob changes training only. What the evaluator measures, and when (the checkpoint
schedule, how many evaluations fitness averages), is the run's (`evaluation` in the run
config): a harness that sets it is refused (MEASUREMENT_KEYS; docs/harness.md has the audit).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from evotrainer.errors import UsageError


@dataclass(frozen=True)
class Knobs:
    reward: str = "binary"
    group_filter: str = "keep_all"
    refill_rounds: int = 0
    advantage: str = "grpo"
    policy_loss: str = "clipped"
    loss_agg: str = "token_mean"
    kl_estimator: str = "k3"
    curriculum: str = "fixed"
    action_parser: str = "plain"
    train_levels: tuple[int, ...] = field(default_factory=tuple)
    lr: float = 3e-4
    warmup_steps: int = 0
    steps: int = 300
    prompts_per_step: int = 64
    group_size: int = 8
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 0
    clip_low: float = 0.2
    clip_high: float = 0.2
    clip_delta: float = 0.0
    mask_truncated: bool = False
    top_entropy_quantile: float = 1.0
    tis_cap: float = 0.0
    num_iterations: int = 1
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.99

    def validate(self) -> "Knobs":
        def need(ok: bool, msg: str):
            if not ok:
                raise UsageError(f"knob {msg}")
        need(self.lr > 0, f"lr must be > 0, got {self.lr}")
        need(self.steps >= 0, f"steps must be >= 0, got {self.steps}")
        need(self.warmup_steps >= 0, f"warmup_steps must be >= 0, got {self.warmup_steps}")
        need(self.prompts_per_step >= 1, f"prompts_per_step must be >= 1, got {self.prompts_per_step}")
        need(self.group_size >= 2, f"group_size must be >= 2 (GRPO compares within a group), got {self.group_size}")
        need(self.temperature > 0, f"temperature must be > 0, got {self.temperature}")
        need(self.top_k >= 0, f"top_k must be >= 0 (0: no top-k), got {self.top_k}")
        need(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        need(self.max_new_tokens >= 0, f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        need(0 <= self.clip_low < 1, f"clip_low must be in [0, 1), got {self.clip_low}")
        need(self.clip_high >= 0, f"clip_high must be >= 0, got {self.clip_high}")
        need(self.clip_delta == 0 or self.clip_delta > 1 + self.clip_high,
             f"clip_delta must be 0 (off) or above 1 + clip_high = {1 + self.clip_high:g}, got {self.clip_delta}")
        need(0 < self.top_entropy_quantile <= 1, f"top_entropy_quantile must be in (0, 1], got {self.top_entropy_quantile}")
        need(self.tis_cap == 0 or self.tis_cap >= 1, f"tis_cap must be 0 (off) or >= 1, got {self.tis_cap}")
        need(0 <= self.refill_rounds <= 16, f"refill_rounds must be in [0, 16], got {self.refill_rounds}")
        need(self.num_iterations >= 1, f"num_iterations must be >= 1, got {self.num_iterations}")
        need(self.kl_coef >= 0, f"kl_coef must be >= 0, got {self.kl_coef}")
        need(self.max_grad_norm >= 0, f"max_grad_norm must be >= 0, got {self.max_grad_norm}")
        need(not (self.kl_coef and self.kl_estimator == "k1"),
             "kl_estimator 'k1' with kl_coef > 0: k1's expected gradient on-policy is zero, so the penalty "
             "would be noise; use kl_estimator: k2 (the KL's own gradient) or k3")
        need(all(isinstance(lv, int) for lv in self.train_levels), f"train_levels must be integers, got {list(self.train_levels)}")
        return self

    def completion_budget(self, task_budget: int) -> int:
        """Tokens a completion may take: the task's budget, or this harness's lower one (a
        harness may truncate below the task's budget, never raise it)."""
        return min(self.max_new_tokens, task_budget) if self.max_new_tokens else task_budget

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["train_levels"] = list(self.train_levels)
        return d


FIELDS = {f.name: f for f in dataclasses.fields(Knobs)}
# keys a harness may not set, because each would change what the evaluator measures or when:
# a harness that saved checkpoints only at the end would be read at its last one while its
# control is an average of earlier ones, i.e. it would steer its own fitness
MEASUREMENT_KEYS = {
    "eval_every": "the checkpoint schedule is the run's (evaluation.every in the run config)",
    "last_k": "how many evaluations fitness averages is the run's (evaluation.last_k in the run config)",
    "evaluation": "what the evaluator measures is the run's (evaluation in the run config)",
}


def measurement_refusal(key: str, source: str = "knobs.yaml") -> str | None:
    """The one-line reason a harness may not set `key`, or None if it may."""
    why = MEASUREMENT_KEYS.get(key)
    return why and f"{source} sets '{key}': {why}, a harness may not change what the evaluator measures"


def knobs_from_dict(raw: dict, source: str = "knobs") -> Knobs:
    if not isinstance(raw, dict):
        raise UsageError(f"{source}: expected a mapping of knob names to values, got {type(raw).__name__}")
    for key in raw:
        if measurement_refusal(key):
            raise UsageError(measurement_refusal(key, source))
    bad = sorted(set(raw) - set(FIELDS))
    if bad:
        raise UsageError(f"{source}: unknown knob '{bad[0]}'; valid knobs: {', '.join(FIELDS)}")
    vals = {}
    for k, v in raw.items():
        default = FIELDS[k].default if FIELDS[k].default is not dataclasses.MISSING else ()
        vals[k] = _coerce(k, v, type(default), source)
    return Knobs(**vals).validate()


def _coerce(key, value, typ, source):
    try:
        if typ is tuple:
            if not isinstance(value, (list, tuple)) or not all(type(v) is int for v in value):
                raise TypeError
            return tuple(value)
        if typ is str:
            if not isinstance(value, str):
                raise TypeError
            return value
        if typ is bool:
            if not isinstance(value, bool):
                raise TypeError
            return value
        if isinstance(value, bool) or isinstance(value, (list, dict)) or value is None:
            raise TypeError
        if typ is int and isinstance(value, float) and not value.is_integer():
            raise TypeError
        return typ(value)
    except (TypeError, ValueError):
        kind = "a list of integers" if typ is tuple else "true or false" if typ is bool else typ.__name__
        raise UsageError(f"{source}: knob '{key}' must be {kind}, got {value!r}") from None


def read_yaml(text: str | bytes) -> object:
    """yaml.safe_load, with libyaml's parser where PyYAML has it (ten times faster: knobs files
    are read on every trial, and the search simulator runs thousands)."""
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def load_knobs(path: Path) -> Knobs:
    try:
        raw = read_yaml(Path(path).read_text()) or {}
    except yaml.YAMLError as e:
        line = getattr(getattr(e, "problem_mark", None), "line", None)
        where = f" at line {line + 1}" if line is not None else ""
        raise UsageError(f"{path}: malformed YAML{where}") from None
    return knobs_from_dict(raw, source=str(path))

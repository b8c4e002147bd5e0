"""The intervention catalog: known single-variable changes to a harness, as small functions.

Each entry reads the parent's knobs and returns a `Proposal` (one knob or one slot
changed, with its hypothesis, what stays frozen, the success criterion and the rollback),
or None where it does not apply (already in place). Entries are grouped by the
intervention family a diagnostic finding suggests (`reward`, `group_filter`, ...).
"""
from __future__ import annotations

import re
from dataclasses import fields, replace
from typing import Callable

from evotrainer.agents.interface import Proposal
from evotrainer.harness.knobs import Knobs
from evotrainer.harness.registry import Registry


Intervention = Callable[[Knobs, int], "Proposal | None"]
INTERVENTIONS: Registry[Intervention] = Registry("intervention")
FAMILY: dict[str, str] = {}


def intervention(family: str):
    def deco(fn: Intervention) -> Intervention:
        FAMILY[fn.__name__] = family
        return INTERVENTIONS.register()(fn)
    return deco


def one_knob(name: str, family: str, knob: str, *, old, new, why: str, expect: str) -> Proposal:
    """A proposal that sets one knob from `old` to `new` (the catalog's and the search space's form)."""
    return Proposal(name, family, f"changing {knob} from {old} to {new} {expect} because {why}",
                    "every other knob and slot of the parent", "validation accuracy beats the control's "
                    "(the parent continued unchanged) beyond the noise floor, with no blocking finding",
                    f"revert {knob} to {old}", {knob: new})


@intervention("reward")
def partial_credit(k: Knobs, target: int) -> Proposal | None:
    if k.reward == "partial_credit":
        return None
    return one_knob("partial_credit", "reward", "reward", old=k.reward, new="partial_credit",
                why="most groups share one score, so a binary reward leaves them without gradient",
                expect="lowers the dead-group ratio and raises accuracy")


@intervention("reward_hacking")
def binary_reward(k: Knobs, target: int) -> Proposal | None:
    if k.reward == "binary":
        return None  # subtract rather than add: back to the verifier score itself
    return one_knob("binary_reward", "reward_hacking", "reward", old=k.reward, new="binary",
                why="the shaped reward rises while the verifier score does not", expect="ends the hack")


@intervention("group_filter")
def drop_dead(k: Knobs, target: int) -> Proposal | None:
    if k.group_filter == "drop_dead":
        return None
    return one_knob("drop_dead", "group_filter", "group_filter", old=k.group_filter, new="drop_dead",
                    why="groups with equal rewards only dilute the token-mean loss",
                    expect="concentrates the update on live groups")


@intervention("group_filter")
def score_spread(k: Knobs, target: int) -> Proposal | None:
    if k.group_filter == "score_spread":
        return None
    return one_knob("score_spread", "group_filter", "group_filter", old=k.group_filter, new="score_spread",
                why="only groups whose verifier scores disagree teach correctness (DAPO dynamic sampling)",
                expect="keeps the gradient on correctness")


@intervention("group_filter")
def dynamic_sampling(k: Knobs, target: int) -> Proposal | None:
    if k.refill_rounds or k.group_filter == "keep_all":
        return None  # without a filter nothing is dropped, so nothing refills: drop_dead or score_spread first
    return one_knob("dynamic_sampling", "group_filter", "refill_rounds", old=0, new=3,
                    why="the filter leaves each step a small, noisy batch; refilling it with groups the filter keeps "
                    "makes every update a full one (DAPO dynamic sampling: filter and refill)",
                    expect="trains on a full batch of informative groups every step")


@intervention("optimisation")
def lower_lr(k: Knobs, target: int) -> Proposal | None:
    return one_knob("lower_lr", "optimisation", "lr", old=k.lr, new=round(k.lr / 2, 10),
                why="the score is falling, the signature of too large a step", expect="stops the decline")


@intervention("optimisation")
def raise_lr(k: Knobs, target: int) -> Proposal | None:
    if k.lr >= 1e-3:
        return None  # 1e-3 collapsed the tiny policy (reference knobs.yaml)
    return one_knob("raise_lr", "optimisation", "lr", old=k.lr, new=round(k.lr * 1.5, 10),
                    why="the score rises slowly and steadily, so the step is smaller than it could be",
                    expect="learns faster")


@intervention("optimisation")
def warmup(k: Knobs, target: int) -> Proposal | None:
    if k.warmup_steps:
        return None
    return one_knob("warmup", "optimisation", "warmup_steps", old=0, new=10,
                    why="the first updates on a fresh segment are the largest and least informed",
                    expect="avoids an early collapse")


@intervention("exploration")
def raise_temperature(k: Knobs, target: int) -> Proposal | None:
    if k.temperature >= 1.5:
        return None
    return one_knob("raise_temperature", "exploration", "temperature", old=k.temperature,
                    new=round(k.temperature + 0.2, 3), why="samples have collapsed onto a few completions",
                    expect="restores diverse groups")


@intervention("exploration")
def entropy_bonus(k: Knobs, target: int) -> Proposal | None:
    if k.entropy_coef:
        return None
    return one_knob("entropy_bonus", "exploration", "entropy_coef", old=0.0, new=0.001,
                why="entropy is falling faster than accuracy rises", expect="slows the collapse of exploration")


# with one update per sampled batch every ratio is 1 and no clip bound is reached: the
# clip-higher of DAPO, which reuses each batch over several updates, applies where the parent does
@intervention("exploration")
def clip_higher(k: Knobs, target: int) -> Proposal | None:
    if k.clip_high > k.clip_low or k.num_iterations == 1:
        return None
    return one_knob("clip_higher", "exploration", "clip_high", old=k.clip_high, new=0.28,
                    why="a symmetric clip caps how fast unlikely tokens can rise (DAPO clip-higher)",
                    expect="keeps exploration alive")


@intervention("exploration")
def entropy_tokens(k: Knobs, target: int) -> Proposal | None:
    if k.top_entropy_quantile < 1:
        return None
    return one_knob("entropy_tokens", "exploration", "top_entropy_quantile", old=1.0, new=0.2,
                    why="the learning rides on the minority of high-entropy forking tokens, while the confident "
                    "majority's gradient mostly sharpens what the policy already does (Wang et al. 2506.01939)",
                    expect="keeps exploration alive while accuracy rises")


# GSPO, CISPO and two-sided clipping change how an update treats ratios away from 1; with one
# update per sampled batch every ratio is 1 and each is the clipped loss, so they apply only
# where the parent reuses its batch (num_iterations > 1)
@intervention("signal")
def gspo(k: Knobs, target: int) -> Proposal | None:
    if k.policy_loss == "gspo" or k.num_iterations == 1:
        return None
    return one_knob("gspo", "signal", "policy_loss", old=k.policy_loss, new="gspo",
                    why="token ratios of a reused batch are noisy and their clip acts token by token; one ratio per "
                    "sequence matches the sequence-level reward (GSPO 2507.18071)",
                    expect="steadies the reused updates")


@intervention("signal")
def cispo(k: Knobs, target: int) -> Proposal | None:
    if k.policy_loss == "cispo" or k.num_iterations == 1:
        return None
    return one_knob("cispo", "signal", "policy_loss", old=k.policy_loss, new="cispo",
                    why="PPO's clip drops the gradient of the tokens whose ratio moved most, often the rare forks; "
                    "clipping the weight instead keeps every token's gradient (CISPO, MiniMax-M1 2506.13585)",
                    expect="learns from the clipped tokens too")


@intervention("optimisation")
def two_sided_clip(k: Knobs, target: int) -> Proposal | None:
    if k.clip_delta or k.num_iterations == 1 or k.policy_loss != "clipped":
        return None
    return one_knob("two_sided_clip", "optimisation", "clip_delta", old=0.0, new=4.0,
                    why="a token the update made far likelier gets an unbounded push down when its advantage is "
                    "negative (INTELLECT-2's two-sided clipping, 2505.07291)",
                    expect="avoids the large negative updates")


@intervention("optimisation")
def tis(k: Knobs, target: int) -> Proposal | None:
    if k.tis_cap or (k.top_p == 1 and not k.top_k):
        return None  # sampler and trainer agree: every weight is 1
    return one_knob("tis", "optimisation", "tis_cap", old=0.0, new=2.0,
                    why="top-p or top-k sampling draws from a filtered distribution the loss's log-probs do not "
                    "have, so the update is off-policy from its first step (truncated importance sampling, "
                    "Yao et al. 2025)", expect="corrects the update to the sampler's distribution")


@intervention("optimisation")
def kl_anchor(k: Knobs, target: int) -> Proposal | None:
    if k.kl_coef:
        return None
    return one_knob("kl_anchor", "optimisation", "kl_coef", old=0.0, new=0.01,
                    why="the policy drifts from the skills the base had",
                    expect="keeps easier skills while the target improves")


@intervention("group_filter")
def std_filter(k: Knobs, target: int) -> Proposal | None:
    if k.group_filter == "std_ema":
        return None
    return one_knob("std_filter", "group_filter", "group_filter", old=k.group_filter, new="std_ema",
                why="groups with little reward spread add noise more than signal (EvoTrainer's StdGroupFilter, "
                "EMA threshold mean - 1.28 sd)", expect="keeps the most informative 90% of live groups")


@intervention("signal")
def larger_groups(k: Knobs, target: int) -> Proposal | None:
    if k.group_size >= 16 or k.prompts_per_step < 2:
        return None
    # one variable, the group size, at equal rollouts per step: prompts per step halve with it
    p = one_knob("larger_groups", "signal", "group_size", old=k.group_size, new=k.group_size * 2,
             why="with few correct samples per group most groups are all wrong; a larger group finds a correct "
             "one more often", expect="revives dead groups at equal rollouts per step")
    return replace(p, knobs={"group_size": k.group_size * 2, "prompts_per_step": k.prompts_per_step // 2},
                   frozen="every other knob and slot; rollouts per step (prompts_per_step halves)",
                   rollback=f"revert group_size to {k.group_size} and prompts_per_step to {k.prompts_per_step}")


@intervention("signal")
def dr_grpo(k: Knobs, target: int) -> Proposal | None:
    if k.advantage == "dr_grpo":
        return None
    return one_knob("dr_grpo", "signal", "advantage", old=k.advantage, new="dr_grpo",
                    why="dividing by the group std inflates tiny reward differences (Dr. GRPO)",
                    expect="weights groups by real spread")


@intervention("signal")
def seq_mean(k: Knobs, target: int) -> Proposal | None:
    if k.loss_agg == "seq_mean_token_mean":
        return None
    return one_knob("seq_mean", "signal", "loss_agg", old=k.loss_agg, new="seq_mean_token_mean",
                why="token-mean lets long completions dominate the update", expect="weights every rollout the same")


@intervention("signal")
def token_level(k: Knobs, target: int) -> Proposal | None:
    if k.loss_agg == "token_mean":
        return None
    return one_knob("token_level", "signal", "loss_agg", old=k.loss_agg, new="token_mean",
                    why="a mean per sequence gives each token of a long completion less weight, so long wrong "
                    "answers are punished less than short ones and length grows (DAPO token-level loss)",
                    expect="stops the length drift")


@intervention("curriculum")
def easier_mix(k: Knobs, target: int) -> Proposal | None:
    if k.train_levels or target <= 1:
        return None
    return one_knob("easier_mix", "curriculum", "train_levels", old=[], new=[target - 1, target],
                why="the target level is mostly unsolved, while the level below still gives signal",
                expect="keeps groups alive and easier skills intact")


@intervention("curriculum")
def frontier_curriculum(k: Knobs, target: int) -> Proposal | None:
    if k.curriculum == "frontier" or not k.train_levels:
        return None  # with one level there is nothing to weigh
    return one_knob("frontier_curriculum", "curriculum", "curriculum", old=k.curriculum, new="frontier",
                why="levels already solved or hopeless give little signal; p(1-p) weighting trains where "
                "outcomes are mixed", expect="raises the share of live groups")


@intervention("efficiency")
def overlong_shaping(k: Knobs, target: int) -> Proposal | None:
    if k.reward != "binary":
        return None  # one reward at a time: shaping on top of another shaped reward is two variables
    return one_knob("overlong_shaping", "efficiency", "reward", old=k.reward, new="overlong_penalty",
                why="truncated completions cost compute and carry no answer (DAPO soft overlong punishment)",
                expect="cuts truncation without cutting correct answers")


@intervention("efficiency")
def truncate(k: Knobs, target: int) -> Proposal | None:
    if k.max_new_tokens:
        return None
    return one_knob("truncate", "efficiency", "max_new_tokens", old=0, new=target + 2,
                why="completions run past any possible answer", expect="stops paying for over-long answers")


@intervention("efficiency")
def mask_truncated(k: Knobs, target: int) -> Proposal | None:
    if k.mask_truncated:
        return None
    return one_knob("mask_truncated", "efficiency", "mask_truncated", old=False, new=True,
                    why="a completion cut at the token budget has no answer to judge, and its tokens are pushed down "
                    "for the budget's fault (DAPO overlong filtering)", expect="stops punishing unfinished reasoning")


def set_knob(text: str, key: str, value) -> str:
    """knobs.yaml with `key` set to `value`, comments and order kept; appended if absent."""
    rendered = f"{key}: {_yaml(value)}"
    pattern = re.compile(rf"^{re.escape(key)}:.*$", re.M)
    if pattern.search(text):
        return pattern.sub(rendered, text, count=1)
    return text + ("" if text.endswith("\n") or not text else "\n") + rendered + "\n"


def _yaml(value) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(map(str, value)) + "]"
    if isinstance(value, float):
        return repr(value)
    return str(value)


# knobs that travel together: a group size change keeps rollouts per step equal
_COUPLED = {"group_size": ("prompts_per_step",)}
_NOT_INTERVENTIONS = ("steps", "prompts_per_step")  # the run's budget, never an intervention


def revert(k: Knobs, root: Knobs) -> list[Proposal]:
    """Subtracting: one proposal per knob where `k` differs from the root harness, setting it
    back (EvoTrainer's "after three failures, subtract rather than add")."""
    out = []
    for f in fields(Knobs):
        name, now, then = f.name, getattr(k, f.name), getattr(root, f.name)
        if name in _NOT_INTERVENTIONS or now == then:
            continue
        change = {name: _plain(then)} | {c: _plain(getattr(root, c)) for c in _COUPLED.get(name, ())}
        out.append(Proposal(f"revert_{name}", "subtract",
                            f"changing {name} from {_plain(now)} back to the root's {_plain(then)} recovers the "
                            "lost accuracy because the changes since the last good version did not hold up",
                            "every other knob and slot of the parent",
                            "validation accuracy beats the control's beyond the noise floor, with no blocking finding",
                            f"set {name} to {_plain(now)} again", change))
    return out


def _plain(v):
    return list(v) if isinstance(v, tuple) else v

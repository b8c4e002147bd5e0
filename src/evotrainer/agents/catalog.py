"""The intervention catalog: known single-variable changes to a harness, as small functions.

Each entry reads the parent's knobs and returns a `Proposal` (one knob or one slot
changed, with its hypothesis, what stays frozen, the success criterion and the rollback),
or None where it does not apply (already in place). Entries are grouped by the
intervention family a diagnostic finding suggests (`reward`, `group_filter`, ...).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from evotrainer.harness.knobs import Knobs
from evotrainer.harness.registry import Registry


@dataclass(frozen=True)
class Proposal:
    intervention: str              # catalog name
    family: str                    # reward | group_filter | optimisation | exploration | efficiency | curriculum | signal
    hypothesis: str                # "changing X improves Y because Z"
    frozen: str                    # what stays as it is
    success_criterion: str
    rollback: str
    knobs: dict = field(default_factory=dict)   # knob -> new value (the one variable)
    files: dict = field(default_factory=dict)   # slot file -> its new source (a slot the knob names)
    agent: str = "rules"


Intervention = Callable[[Knobs, int], "Proposal | None"]
CATALOG: Registry[Intervention] = Registry("intervention")
FAMILY: dict[str, str] = {}


def intervention(family: str):
    def deco(fn: Intervention) -> Intervention:
        FAMILY[fn.__name__] = family
        return CATALOG.register()(fn)
    return deco


def _one(name: str, family: str, knob: str, old, new, why: str, expect: str) -> Proposal:
    return Proposal(name, family, f"changing {knob} from {old} to {new} {expect} because {why}",
                    f"every other knob and slot of the parent", f"validation accuracy beats the control's "
                    f"(the parent continued unchanged) beyond the noise floor, with no blocking finding",
                    f"revert {knob} to {old}", {knob: new})


@intervention("reward")
def partial_credit(k: Knobs, target: int) -> Proposal | None:
    if k.reward == "partial_credit":
        return None
    return _one("partial_credit", "reward", "reward", k.reward, "partial_credit",
                "most groups share one score, so a binary reward leaves them without gradient",
                "lowers the dead-group ratio and raises accuracy")


@intervention("reward_hacking")
def binary_reward(k: Knobs, target: int) -> Proposal | None:
    if k.reward == "binary":
        return None  # subtract rather than add: back to the verifier score itself
    return _one("binary_reward", "reward_hacking", "reward", k.reward, "binary",
                "the shaped reward rises while the verifier score does not", "ends the hack")


@intervention("group_filter")
def drop_dead(k: Knobs, target: int) -> Proposal | None:
    if k.group_filter == "drop_dead":
        return None
    return _one("drop_dead", "group_filter", "group_filter", k.group_filter, "drop_dead",
                "groups with equal rewards only dilute the token-mean loss", "concentrates the update on live groups")


@intervention("group_filter")
def score_spread(k: Knobs, target: int) -> Proposal | None:
    if k.group_filter == "score_spread":
        return None
    return _one("score_spread", "group_filter", "group_filter", k.group_filter, "score_spread",
                "only groups whose verifier scores disagree teach correctness (DAPO dynamic sampling)",
                "keeps the gradient on correctness")


@intervention("optimisation")
def lower_lr(k: Knobs, target: int) -> Proposal | None:
    return _one("lower_lr", "optimisation", "lr", k.lr, round(k.lr / 2, 10),
                "the score is falling, the signature of too large a step", "stops the decline")


@intervention("optimisation")
def warmup(k: Knobs, target: int) -> Proposal | None:
    if k.warmup_steps:
        return None
    return _one("warmup", "optimisation", "warmup_steps", 0, 10,
                "the first updates on a fresh segment are the largest and least informed", "avoids an early collapse")


@intervention("exploration")
def raise_temperature(k: Knobs, target: int) -> Proposal | None:
    if k.temperature >= 1.5:
        return None
    return _one("raise_temperature", "exploration", "temperature", k.temperature, round(k.temperature + 0.2, 3),
                "samples have collapsed onto a few completions", "restores diverse groups")


@intervention("exploration")
def entropy_bonus(k: Knobs, target: int) -> Proposal | None:
    if k.entropy_coef:
        return None
    return _one("entropy_bonus", "exploration", "entropy_coef", 0.0, 0.001,
                "entropy is falling faster than accuracy rises", "slows the collapse of exploration")


@intervention("exploration")
def clip_higher(k: Knobs, target: int) -> Proposal | None:
    if k.clip_high > k.clip_low:
        return None
    return _one("clip_higher", "exploration", "clip_high", k.clip_high, 0.28,
                "a symmetric clip caps how fast unlikely tokens can rise (DAPO clip-higher)", "keeps exploration alive")


@intervention("optimisation")
def kl_anchor(k: Knobs, target: int) -> Proposal | None:
    if k.kl_coef:
        return None
    return _one("kl_anchor", "optimisation", "kl_coef", 0.0, 0.01,
                "the policy drifts from the skills the base had", "keeps easier skills while the target improves")


@intervention("signal")
def dr_grpo(k: Knobs, target: int) -> Proposal | None:
    if k.advantage == "dr_grpo":
        return None
    return _one("dr_grpo", "signal", "advantage", k.advantage, "dr_grpo",
                "dividing by the group std inflates tiny reward differences (Dr. GRPO)", "weights groups by real spread")


@intervention("signal")
def seq_mean(k: Knobs, target: int) -> Proposal | None:
    if k.loss_agg == "seq_mean_token_mean":
        return None
    return _one("seq_mean", "signal", "loss_agg", k.loss_agg, "seq_mean_token_mean",
                "token-mean lets long completions dominate the update", "weights every rollout the same")


@intervention("curriculum")
def easier_mix(k: Knobs, target: int) -> Proposal | None:
    if k.train_levels or target <= 1:
        return None
    return _one("easier_mix", "curriculum", "train_levels", [], [target - 1, target],
                "the target level is mostly unsolved, while the level below still gives signal",
                "keeps groups alive and easier skills intact")


@intervention("efficiency")
def truncate(k: Knobs, target: int) -> Proposal | None:
    if k.max_new_tokens:
        return None
    return _one("truncate", "efficiency", "max_new_tokens", 0, target + 2,
                "completions run past any possible answer", "stops paying for over-long answers")


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

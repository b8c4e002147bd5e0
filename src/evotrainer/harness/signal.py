"""Reward -> group filter -> advantage: the one place a harness turns scored rollouts into
the signal the policy gradient reads. The embedded trainer, the TRL backend and the
backtest all call `harness_signal`, so a harness means the same thing everywhere."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from evotrainer.harness.rollouts import Rollouts, check_output


@dataclass
class Signal:
    rewards: torch.Tensor      # [B] what the reward slot paid each rollout
    keep: torch.Tensor         # [B / group_size] bool: the group passed the group filter
    advantages: torch.Tensor   # [B] the advantage slot's output, one per rollout

    @property
    def row_keep(self) -> torch.Tensor:
        """[B] bool: the rollout's group passed the filter."""
        return self.keep.repeat_interleave(len(self.rewards) // len(self.keep))


def harness_signal(harness, ro: Rollouts) -> Signal:
    """Run the harness's reward, group filter and advantage slots on one batch of groups,
    checking each output's type, shape and finiteness (a SlotError names the slot)."""
    B, n, G = len(ro.problems), ro.num_groups, ro.group_size
    rewards = check_output("reward", harness.reward(ro), (B,)).float()
    keep = check_output("group_filter", harness.group_filter(ro.grouped(rewards), ro.grouped(ro.scores)), (n,)).bool()
    adv = check_output("advantage", harness.advantage(ro.grouped(rewards)), (n, G)).reshape(-1).float()
    return Signal(rewards, keep, adv)


def trained_rows(row_keep: torch.Tensor, truncated: torch.Tensor, knobs) -> torch.Tensor:
    """[B] bool: the rollouts whose tokens enter the loss. Their group passed the filter and,
    under mask_truncated (DAPO's overlong filtering), they ended within the token budget."""
    return row_keep & ~truncated.to(row_keep.device) if knobs.mask_truncated else row_keep

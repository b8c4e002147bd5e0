"""One episode as token ids: the policy's turns and the environment's observations, joined
without re-tokenizing anything, and the loss mask over them.

Re-tokenizing a history changes the ids the policy sampled (BPE merges across a turn
boundary), and then the log-probabilities the loss compares are of tokens the policy never
chose. So the ids are kept as they were made: the prompt's, then per turn the ids the
policy sampled (its end-of-turn token included, which it also chose) and the observation's
ids as the tokenizer made them once. The loss mask is 1 exactly on the policy's sampled
ids of this episode and 0 on the prompt, observations, tool output and padding; the
outcome reward sits on the last policy token, and the advantage reaches every policy token.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Episode:
    prompt_ids: list[int]
    turns: list[tuple[list[int], list[int]]] = field(default_factory=list)  # (policy ids, observation ids)

    def add(self, policy_ids: list[int], observation_ids: list[int]) -> None:
        self.turns.append((list(policy_ids), list(observation_ids)))

    def tokens(self) -> int:
        """The history's length: what the token cap counts."""
        return len(self.prompt_ids) + sum(len(p) + len(o) for p, o in self.turns)

    def assemble(self) -> tuple[list[int], list[int]]:
        """(ids, loss mask) of the whole episode, in order."""
        ids, mask = list(self.prompt_ids), [0] * len(self.prompt_ids)
        for policy, obs in self.turns:
            ids += policy + obs
            mask += [1] * len(policy) + [0] * len(obs)
        return ids, mask

    def reward_position(self) -> int:
        """Index (in `assemble`'s ids) of the last policy token, where the outcome reward sits."""
        _, mask = self.assemble()
        last = max((i for i, m in enumerate(mask) if m), default=None)
        if last is None:
            raise ValueError("an episode with no policy token has nowhere to put its reward")
        return last


def pad(rows: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    """Right-pad assembled episodes to one length: (ids, loss masks, attention masks); padding
    has loss mask 0 and attention mask 0."""
    width = max(len(ids) for ids, _ in rows)
    out_ids, out_mask, out_attn = [], [], []
    for ids, mask in rows:
        n = width - len(ids)
        out_ids.append(ids + [pad_id] * n)
        out_mask.append(mask + [0] * n)
        out_attn.append([1] * len(ids) + [0] * n)
    return out_ids, out_mask, out_attn

"""Play a batch of episodes with a policy: the multi-turn rollout of training and evaluation.

Every live episode takes a turn at once: its history (prompt, earlier turns and
observations, as the ids they were made with) is the prompt of one batched sampling call;
histories that coincide (a GRPO group's first turn) share one forward. The policy's ids of a
turn, its end token included, go into the episode as sampled; the environment's answer is
tokenized once and appended. Caps are the trainer's: a turn stops at `turn_tokens`, an
episode at `max_turns` turns or `max_tokens` tokens, and then the environment is asked for
the reward of the state as it stands (`Environment.truncate`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from evotrainer.envs.base import TOKEN_CAP, TURN_CAP, Caps, Environment, Step, Trace
from evotrainer.envs.episode import Episode
from evotrainer.policy.generate import Generation, decode_ids, generate
from evotrainer.policy.prompts import observation_token_ids, pad_left, prompt_token_ids


@dataclass
class Played:
    """One finished episode: its ids, what the policy wrote and saw, and how it ended."""
    episode: Episode
    texts: list[str] = field(default_factory=list)         # the policy's turns (end token excluded)
    observations: list[str] = field(default_factory=list)  # the environment's answers
    logprobs: list[float] = field(default_factory=list)    # sampling log-prob of each policy token
    entropies: list[float] = field(default_factory=list)   # sampling entropy at each policy token
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    stop: str = ""
    trace: Trace = field(default_factory=Trace)
    prompt: str = ""  # the first observation: what reset said (an environment that deals from a seed writes it there)

    @property
    def turns(self) -> int:
        return len(self.texts)

    def transcript(self) -> str:
        """The episode after its prompt, as text: each policy turn, then what came back."""
        return "".join(f"{t}\n{o}" for t, o in zip(self.texts, self.observations + [""] * self.turns)).rstrip("\n")

    def finish(self, step: Step, trace: Trace) -> None:
        self.reward, self.terminated, self.truncated = float(step.reward), step.terminated, step.truncated
        self.stop, self.trace = str(step.info.get("stop", "")), trace


@torch.no_grad()
def play(model, tok, envs: list[Environment], caps: Caps, stop_ids: list[int], *, seeds: list[int] | None = None,
         greedy: bool = False, temperature: float = 1.0, generator: torch.Generator | None = None,
         top_k: int = 0, top_p: float = 1.0, chat_template: bool = True) -> list[Played]:
    """Play every environment to its end; each is closed afterwards, whatever happens."""
    device = next(model.parameters()).device
    try:
        prompts = [env.reset(s) for env, s in zip(envs, seeds or range(len(envs)))]
        out = [Played(Episode(ids), prompt=text) for ids, text in zip(prompt_token_ids(tok, prompts, chat_template), prompts)]
        live = list(range(len(envs)))
        for _ in range(caps.max_turns):
            live = [i for i in live if not _out_of_room(out[i], envs[i], caps)]
            if not live:
                break
            _turn(model, tok, [out[i] for i in live], [envs[i] for i in live], caps=caps, stop_ids=stop_ids,
                  greedy=greedy, temperature=temperature, generator=generator, top_k=top_k, top_p=top_p,
                  chat_template=chat_template, device=device)
            live = [i for i in live if not out[i].stop]
        for i in live:  # still going after the last allowed turn
            out[i].finish(envs[i].truncate(TURN_CAP), envs[i].trace)
        return out
    finally:
        for env in envs:
            env.close()


def _out_of_room(p: Played, env: Environment, caps: Caps) -> bool:
    if p.stop:
        return True
    if p.episode.tokens() >= caps.max_tokens:
        p.finish(env.truncate(TOKEN_CAP), env.trace)
        return True
    return False


def _turn(model, tok, played: list[Played], envs: list[Environment], *, caps: Caps, stop_ids, greedy, temperature,
          generator, top_k, top_p, chat_template, device) -> None:
    """One policy turn of each live episode, then the environments' answers."""
    histories = [tuple(p.episode.assemble()[0]) for p in played]
    distinct = {h: i for i, h in enumerate(dict.fromkeys(histories))}  # history -> its row
    index = torch.tensor([distinct[h] for h in histories], device=device)
    ids, mask = pad_left([list(h) for h in distinct], tok.pad_token_id, device)  # in first-seen order
    rooms = [caps.max_tokens - len(h) for h in histories]
    gen = generate(model, ids, mask, max_new_tokens=min(caps.turn_tokens, max(rooms)), stop_ids=stop_ids,
                   pad_id=tok.pad_token_id, temperature=temperature, greedy=greedy, generator=generator, top_k=top_k,
                   top_p=top_p, index=index)
    for row, (p, env, room) in enumerate(zip(played, envs, rooms)):
        n = min(int(gen.lengths[row]), room)
        sampled = gen.completion_ids[row, :n].tolist()
        ended = n > 0 and sampled[-1] in stop_ids
        p.logprobs += gen.logprobs[row, :n].tolist()
        p.entropies += gen.entropy[row, :n].tolist()
        p.texts.append(decode_ids(tok, [sampled[:-1] if ended else sampled])[0])
        if n >= room and not ended:  # the episode's token cap cut this turn
            p.episode.add(sampled, [])
            p.finish(env.truncate(TOKEN_CAP), env.trace)
            continue
        step = env.step(p.texts[-1])
        if step.terminated or step.truncated:
            p.episode.add(sampled, [])
            p.finish(step, env.trace)
            continue
        obs = observation_token_ids(tok, step.observation, chat_template)
        p.episode.add(sampled, obs[:max(room - n, 0)])  # an observation past the cap is cut there
        p.observations.append(step.observation)


def as_generation(played: list[Played], pad_id: int, width: int, device=None) -> Generation:
    """The episodes as one batch the trainer's update reads: the prompts, then everything after
    them as the "completion", whose mask is the loss mask (1 on policy ids only; observations
    and padding 0) and whose log-probs and entropies are the sampling policy's at those ids.
    `width`: the columns of the completion (the episode cap; Dr. GRPO's constant divides by it)."""
    prompts = [tuple(p.episode.prompt_ids) for p in played]
    distinct = {q: i for i, q in enumerate(dict.fromkeys(prompts))}
    prompt_ids, prompt_mask = pad_left([list(q) for q in distinct], pad_id, device)
    B = len(played)
    ids = torch.full((B, width), pad_id, dtype=torch.long)
    mask = torch.zeros((B, width), dtype=torch.long)
    logp, ent = torch.zeros(B, width), torch.zeros(B, width)
    for b, p in enumerate(played):
        full, m = p.episode.assemble()
        after, m = full[len(p.episode.prompt_ids):], m[len(p.episode.prompt_ids):]
        if len(after) > width:
            raise ValueError(f"an episode of {len(after)} tokens after its prompt does not fit the width {width}")
        ids[b, :len(after)] = torch.tensor(after, dtype=torch.long)
        mask[b, :len(m)] = torch.tensor(m, dtype=torch.long)
        pos = mask[b].nonzero().squeeze(-1)
        logp[b, pos] = torch.tensor(p.logprobs, dtype=torch.float32)
        ent[b, pos] = torch.tensor(p.entropies, dtype=torch.float32)
    cols = max(p.episode.tokens() - len(p.episode.prompt_ids) for p in played) or 1  # the longest episode
    index = torch.tensor([distinct[q] for q in prompts], device=device)
    truncated = torch.tensor([p.truncated for p in played], device=device)
    return Generation(prompt_ids, prompt_mask, index, ids[:, :cols].to(device), mask[:, :cols].to(device),
                      truncated, logp[:, :cols].to(device), ent[:, :cols].to(device))

"""The environment interface and an episode's tokens: the loss mask checked token by token on
a scripted two-turn rollout (issue 19's first piece; the trainer does not play episodes yet)."""
import pytest

from evotrainer.envs import Caps, Episode, SingleTurn, pad
from evotrainer.policy import build_tokenizer
from evotrainer.tasks import get_task


def test_a_scripted_two_turn_episode_masks_exactly_the_policys_tokens():
    tok = build_tokenizer()
    eos = tok.eos_token_id
    enc = (lambda text: tok(text, add_special_tokens=False)["input_ids"])
    prompt, turn1, obs1, turn2 = enc("key a? "), enc("get a"), enc(" a=3\n"), enc("3")
    ep = Episode(prompt)
    ep.add(turn1 + [eos], obs1)     # the policy's end-of-turn token is its own: masked in
    ep.add(turn2 + [eos], [])       # the last turn: no observation after it
    ids, mask = ep.assemble()
    want = [(t, 0) for t in prompt] + [(t, 1) for t in turn1 + [eos]] + [(t, 0) for t in obs1] \
        + [(t, 1) for t in turn2 + [eos]]
    assert list(zip(ids, mask)) == want  # token by token: ids never re-tokenized, mask 1 on policy ids only
    assert sum(mask) == len(turn1) + len(turn2) + 2 and ep.tokens() == len(ids)
    assert ep.reward_position() == len(ids) - 1 and ids[ep.reward_position()] == eos
    short = Episode(prompt)
    short.add(turn2 + [eos], [])
    p_ids, p_mask, p_attn = pad([ep.assemble(), short.assemble()], tok.pad_token_id)
    n = len(ids) - len(short.assemble()[0])
    assert p_ids[1][-n:] == [tok.pad_token_id] * n and p_mask[1][-n:] == [0] * n and p_attn[1][-n:] == [0] * n
    assert p_ids[0] == ids and p_mask[0] == mask and p_attn[0] == [1] * len(ids)
    with pytest.raises(ValueError):
        Episode(prompt).reward_position()


def test_a_single_turn_task_is_an_environment_with_one_turn():
    task = get_task("arith", 2)
    p = task.split("val")[0]
    env = SingleTurn(task, p)
    assert env.reset(0) == p.prompt and env.caps.max_turns == 1
    right, wrong = env.step(p.answer), env.step("x")
    assert (right.reward, right.terminated, right.truncated, right.info["stop"]) == (1.0, True, False, "success")
    assert (wrong.reward, wrong.info["stop"]) == (0.0, "fail")
    with pytest.raises(ValueError):
        Caps(max_turns=0).validate()

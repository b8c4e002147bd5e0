"""The environment interface and an episode's tokens: the loss mask checked token by token on
a scripted two-turn rollout, on played episodes (the tiny policy's and a chat model's), and
in the trainer's records."""
import pytest

from evotrainer.catalog import get_task
from evotrainer.envs import Caps, Episode, SingleTurn, pad
from evotrainer.policy import build_tokenizer


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


# ---------------------------------------------------------------- parsers, vault, playing

import torch  # noqa: E402

from helpers import write_harness  # noqa: E402
from evotrainer.envs import ABANDON, ECHO, FAIL, INVALID, SUCCESS, TOKEN_CAP, TURN_CAP, Environment, Step  # noqa: E402
from evotrainer.envs.play import as_generation, play  # noqa: E402
from evotrainer.errors import UsageError  # noqa: E402
from evotrainer.harness import load_harness  # noqa: E402
from evotrainer.harness.actions import json_call, plain  # noqa: E402
from evotrainer.trainer.grpo import GRPOTrainer  # noqa: E402
from evotrainer.trainer.backends import check_backend  # noqa: E402
from evotrainer.policy import build_model  # noqa: E402
from evotrainer.runtime import Runtime  # noqa: E402

TOOLS = {"look": ("key",), "edit": ("path", "old", "new"), "submit": ()}


def test_parsers_read_plain_and_json_tool_calls_and_refuse_anything_else():
    assert plain("look b", TOOLS).args == {"key": "b"}
    assert plain("edit m.py|a-b|a|b", TOOLS).args == {"path": "m.py", "old": "a-b", "new": "a|b"}  # last takes the rest
    assert plain("submit", TOOLS).name == "submit"
    for bad in ("lok b", "edit m.py|x", "submit now", ""):
        assert plain(bad, TOOLS) is None, bad
    assert json_call('<tool_call>{"name": "look", "arguments": {"key": "b"}}</tool_call>', TOOLS).args == {"key": "b"}
    assert json_call('{"name": "look", "arguments": "{\\"key\\": 3}"}', TOOLS).args == {"key": "3"}
    for bad in ('{"name": "look", "arguments": {}}', '{"name": "rm"}', "look b", "[1]"):
        assert json_call(bad, TOOLS) is None, bad


def test_vault_pays_only_a_right_answer_and_names_how_each_episode_ended():
    task = get_task("vault", 2)
    p = task.split("val")[0]
    script = [a for a, _ in task.demonstration(p)]

    def run(actions, t=task):
        env = t.environment(p, plain)
        env.reset(0)
        for a in actions:
            s = env.step(a)
            if s.terminated:
                return s, env.trace
        return s, env.trace

    s, trace = run(script)
    assert (s.reward, s.info["stop"], trace.tools, trace.failures) == (1.0, SUCCESS, ["look", "look", "answer"], 0)
    assert run(script[:1] + ["answer 1 2"])[0].info["stop"] == FAIL
    assert run([f"answer {p.answer}"])[0].info["stop"] == SUCCESS       # a right guess is still right
    assert run(["answer 10 10"])[0].info["stop"] == ABANDON             # no lookup at all
    assert run(["hello"])[0].info["stop"] == INVALID
    env = task.environment(p, plain)
    env.reset(0)
    obs = env.step(script[0]).observation
    assert env.step(obs).info["stop"] == ECHO                            # the observation said back
    locked = get_task("vault?tool=off", 2)
    assert locked.spec == "vault?tool=off" and locked.sft_task().spec == "vault"
    s, trace = run(script, locked)
    assert s.reward == 1.0 and trace.failures == 2   # the same verifier; both lookups failed
    assert p.answer.split()[0] not in locked.environment(p, plain).step(script[0]).observation
    with pytest.raises(UsageError, match="tool must be on or off"):
        get_task("vault?tool=maybe")


class Scripted(Environment):
    """Answers every turn with a fixed observation; ends when told to."""
    tools = {}

    def __init__(self, obs="ok\n", end_after=99, caps=Caps(max_turns=3, max_tokens=200, turn_tokens=6)):
        super().__init__()
        self.obs, self.end_after, self.caps, self.n = obs, end_after, caps, 0

    def reset(self, seed):
        return "go\n"

    def step(self, action):
        self.n += 1
        self.trace.tools.append("x")
        if self.n >= self.end_after:
            return Step("", 1.0, True, False, {"stop": SUCCESS})
        return Step(self.obs, 0.0, False, False)

    def truncate(self, stop):
        return Step("", 0.5, False, True, {"stop": stop})


def test_played_episodes_keep_the_sampled_ids_and_mask_only_them():
    tok = build_tokenizer()
    model = build_model(len(tok), seed=0)
    stops = [tok.eos_token_id]
    obs_ids = tok("ok\n", add_special_tokens=False)["input_ids"]
    envs = [Scripted(end_after=2), Scripted(), Scripted(caps=Caps(max_turns=3, max_tokens=12, turn_tokens=6))]
    out = play(model, tok, envs[:2], envs[0].caps, stops, generator=torch.Generator().manual_seed(0))
    ended, capped = out
    assert (ended.stop, ended.reward, ended.terminated, ended.turns) == (SUCCESS, 1.0, True, 2)
    assert (capped.stop, capped.reward, capped.truncated, capped.turns) == (TURN_CAP, 0.5, True, 3)
    for p in out:
        ids, mask = p.episode.assemble()
        n_prompt = len(p.episode.prompt_ids)
        assert mask[:n_prompt] == [0] * n_prompt and sum(mask) == len(p.logprobs) == len(p.entropies)
        for policy, obs in p.episode.turns:
            assert obs in ([], obs_ids)        # the observation's ids as the tokenizer made them once
            assert len(policy) <= 6            # the turn cap on tokens
    short = play(model, tok, envs[2:], envs[2].caps, stops, generator=torch.Generator().manual_seed(0))[0]
    assert short.stop == TOKEN_CAP and short.episode.tokens() <= 12 and short.truncated
    gen = as_generation(out, tok.pad_token_id, 200)
    for b, p in enumerate(out):
        ids, mask = p.episode.assemble()
        after = ids[len(p.episode.prompt_ids):]
        row_mask = mask[len(p.episode.prompt_ids):]
        assert gen.completion_ids[b, :len(after)].tolist() == after
        assert gen.completion_mask[b].tolist() == row_mask + [0] * (gen.completion_mask.shape[1] - len(after))
        assert gen.logprobs[b][gen.completion_mask[b].bool()].tolist() == pytest.approx(p.logprobs)
        assert float(gen.logprobs[b][~gen.completion_mask[b].bool()].abs().sum()) == 0.0
    assert gen.truncated.tolist() == [False, True]


def test_the_trainer_plays_vault_and_its_records_carry_the_episode(tmp_path):
    # a reward that varies inside groups (policy tokens), so the update has a gradient to apply
    d = write_harness(tmp_path / "h", {"reward.py": "def longer(r):\n    return r.lengths.float() + r.turns.float()\n"},
                      reward="longer")
    tok = build_tokenizer()
    model = build_model(len(tok), seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    tr = GRPOTrainer(model, tok, get_task("vault", 1), load_harness(d), seed=0)
    m, recs = tr.step()
    assert len(recs) == 16 and m.step == 1
    for r, p in zip(recs, tr.played):
        assert r.turns == p.turns >= 1 and r.stop == p.stop and r.tool_sequence.split() == p.trace.tools
        assert r.length == sum(p.episode.assemble()[1])   # policy tokens only
        assert r.terminated == p.terminated and r.truncated == p.truncated
    # a random policy writes no valid call: every episode ends on an invalid action, all rewards 0
    assert {r.stop for r in recs} <= {INVALID, "turn_cap", "token_cap"} and {r.score for r in recs} == {0.0}
    assert m.dead_groups < 1.0 and any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_the_trl_backend_refuses_a_multi_turn_task_in_one_line():
    with pytest.raises(UsageError, match="cannot train the multi-turn task vault: TRL's environment_factory"):
        check_backend(Runtime(backend="trl"), load_harness().knobs, task=get_task("vault"))
    check_backend(Runtime(backend="embedded"), load_harness().knobs, task=get_task("vault"))


def test_pass_at_k_plays_episodes_of_a_multi_turn_task():
    from evotrainer.evaluate.sampled import correct_counts
    tok = build_tokenizer()
    model = build_model(len(tok), seed=0)
    task = get_task("vault", 1)
    counts = correct_counts(model, tok, task, task.split("val", n=3), n=2, batch_size=2)
    assert counts == [0, 0, 0]   # a random policy never calls the tool right (and cannot guess 1 in 90 twice)


def test_a_chat_model_plays_through_its_template_and_observations_are_template_deltas(tiny_qwen):
    """A real model's episode: the prompt as its chat template renders a user message, every
    turn ending at a token the policy sampled (<|im_end|> or <|endoftext|>, both its stops),
    then the template's tool message and next assistant header, tokenized once and masked out."""
    from evotrainer.policy import load_policy
    from evotrainer.policy.prompts import observation_token_ids, stop_token_ids
    model, tok = load_policy(tiny_qwen)
    stops = stop_token_ids(model, tok)
    assert set(stops) == set(tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"]))
    envs = [Scripted(end_after=2, caps=Caps(max_turns=3, max_tokens=200, turn_tokens=40)) for _ in range(4)]
    out = play(model, tok, envs, envs[0].caps, stops, generator=torch.Generator().manual_seed(0))
    delta = observation_token_ids(tok, "ok\n")
    assert tok.decode(delta) == "<|im_start|>tool\nok\n<|im_end|>\n<|im_start|>assistant\n"
    head = tok.apply_chat_template([{"role": "user", "content": "go\n"}], add_generation_prompt=True, tokenize=False)
    for p in out:
        ids, mask = p.episode.assemble()
        assert tok.decode(p.episode.prompt_ids) == head
        for policy, obs in p.episode.turns:
            assert obs in ([], delta)
            assert policy[-1] in stops or len(policy) == 40   # ended by the policy, or by the turn's token cap
        assert [i for i, m in zip(ids, mask) if m] == [t for policy, _ in p.episode.turns for t in policy]
        assert sum(mask) == len(p.logprobs)
    assert all(p.turns == 2 and p.stop == SUCCESS for p in out)

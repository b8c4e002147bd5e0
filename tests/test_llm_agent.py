"""The llm agent against a real chat-completions server on loopback, with the openai SDK as
the client: a good proposal, malformed JSON, a patch that does not apply, an illegal edit, a
syntax error and a reply slower than the timeout each end in the right label; a run goes on
past every one of them, and its lineage shows hypotheses, patches and token counts."""
import json

import pytest
import yaml

from chat_server import ChatServer, Say, proposal
from helpers import agent_context
from evotrainer.agents import AgentFailed, Proposal
from evotrainer.agents.brief import specialist_for
from evotrainer.agents.llm import LLMAgent
from evotrainer.cli import main
from evotrainer.config import LLMConfig, config_from_dict
from evotrainer.errors import UsageError
from evotrainer.lineage import LineageStore
from evotrainer.lineage.events import Stopped

DEAD = {"diagnostic": "dead_group_ratio", "severity": "critical", "blocking": False, "value": 0.9,
        "evidence": "90% of groups share one score", "suggest": "group_filter: drop dead groups or shape the reward"}
GOOD = proposal("drop_dead_groups", [{"file": "knobs.yaml", "search": "group_filter: keep_all",
                                      "replace": "group_filter: drop_dead"}])


@pytest.fixture
def ctx(tmp_path):
    return agent_context([DEAD], tmp_path=tmp_path, parent="v2", lineage="Leaderboard: v2 val 0.120", trial=3)


@pytest.fixture
def serve():
    servers = []

    def start(*script):
        servers.append(ChatServer(list(script)))
        return servers[-1]
    yield start
    for s in servers:
        s.close()


def agent(server, **kw):
    return LLMAgent(LLMConfig(base_url=server.url, model="scripted", **kw), "arith level 3")


def test_a_good_reply_becomes_a_proposal_with_its_hypothesis_files_and_tokens(ctx, serve):
    server = serve(Say(GOOD))
    p = agent(server)(ctx)
    assert isinstance(p, Proposal) and p.agent == "llm" and p.intervention == "drop_dead_groups"
    assert p.family == "signal" == specialist_for(ctx)  # the dead-group finding calls the signal specialist
    assert "group_filter: drop_dead" in p.files["knobs.yaml"] and list(p.files) == ["knobs.yaml"]
    assert p.hypothesis.startswith("changing drop_dead_groups") and p.trigger == "dead_group_ratio:critical"
    assert p.usage["calls"] == 1 and p.usage["requests"] == 1 and p.usage["repairs"] == 0
    assert p.usage["prompt_tokens"] > 100 and p.usage["completion_tokens"] > 10
    # what the model was shown: the specialist's role, the health report, the lineage, the parent's files
    sent = server.requests[0]
    system, user = (m["content"] for m in sent["messages"])
    assert sent["model"] == "scripted" and sent["response_format"] == {"type": "json_object"}
    assert sent["max_tokens"] == 4096 and "max_completion_tokens" not in sent
    assert "signal specialist" in system and "learning signal" in system
    assert "dead_group_ratio [critical] = 0.9" in user and "Leaderboard: v2 val 0.120" in user
    assert "group_filter: keep_all" in user and "- reward: " in user  # knobs.yaml, and the built-in choices
    transcript = json.loads(open(p.usage["transcript"]).read())
    assert [m["role"] for m in transcript["messages"]] == ["system", "user", "assistant"]


def test_the_token_limit_goes_in_the_field_the_endpoint_wants(ctx, serve):
    server = serve(Say(GOOD))
    assert isinstance(agent(server, token_limit="max_completion_tokens", max_tokens=500)(ctx), Proposal)
    assert server.requests[0]["max_completion_tokens"] == 500 and "max_tokens" not in server.requests[0]
    with pytest.raises(UsageError, match="llm.token_limit.*max_tokens, max_completion_tokens"):
        config_from_dict({"task": "arith", "agent": "llm", "llm": {"model": "m", "token_limit": "tokens"}}).validate()


def test_malformed_json_is_sent_back_with_the_reason_and_the_repair_is_used(ctx, serve):
    server = serve(Say('{"name": "x", "hypothesis": '), Say(GOOD))
    p = agent(server, repair_turns=1)(ctx)
    assert isinstance(p, Proposal) and p.usage["repairs"] == 1 and p.usage["calls"] == 2
    repair = server.requests[1]["messages"][-1]["content"]
    assert "not valid JSON" in repair and "Send the whole JSON object again" in repair


@pytest.mark.parametrize("reply, label, why", [
    ("I think you should lower the learning rate.", "unparseable", "not valid JSON"),
    (json.dumps({"name": "x", "edits": []}), "unparseable", "lacks hypothesis"),
    (proposal("lr", [{"file": "knobs.yaml", "search": "lr: 0.1", "replace": "lr: 0.2"}]), "patch_failed",
     "does not occur in knobs.yaml"),
    (proposal("peek", [{"file": "../evaluate/greedy.py", "search": "", "replace": "x = 1\n"}]), "illegal",
     "leaves the harness directory"),
    (proposal("shaped", [{"file": "reward.py", "search": "", "replace": "def shaped(r):\n    return (\n"}]),
     "syntax_error", "reward.py:2: syntax error"),
])
def test_a_reply_that_cannot_be_used_ends_in_its_label_after_the_repair_turns(ctx, serve, reply, label, why):
    server = serve(Say(reply), Say(reply))
    out = agent(server, repair_turns=1)(ctx)
    assert isinstance(out, AgentFailed) and out.label == label and why in out.reason
    assert out.usage["calls"] == 2 and out.usage["repairs"] == 1  # one repair turn, then the label


def test_an_illegal_edit_of_a_harness_file_is_returned_for_the_controller_to_record_and_refuse(ctx, serve):
    more = proposal("more_steps", [{"file": "knobs.yaml", "search": "steps: 300", "replace": "steps: 3000"}])
    p = agent(serve(Say(more)), repair_turns=0)(ctx)
    assert isinstance(p, Proposal) and "steps: 3000" in p.files["knobs.yaml"]  # committed, then labelled illegal


def test_a_reply_slower_than_the_timeout_is_agent_timeout_after_the_sdk_retries(ctx, serve):
    server = serve(Say(GOOD, delay_s=3), Say(GOOD, delay_s=3))
    out = agent(server, timeout_s=0.5, max_retries=1)(ctx)
    assert isinstance(out, AgentFailed) and out.label == "agent_timeout"
    assert out.usage["requests"] == 2 and len(server.requests) == 2  # the first try and one retry


def test_an_endpoint_that_answers_something_else_is_agent_error_not_a_crash(ctx, serve):
    out = agent(serve(Say("<html>502 Bad Gateway</html>", raw=True)))(ctx)
    assert isinstance(out, AgentFailed) and out.label == "agent_error" and "not a chat completion" in out.reason


def test_a_reasoning_models_think_block_before_the_json_is_tolerated(ctx, serve):
    p = agent(serve(Say("<think>the groups are dead, so...</think>\n```json\n" + GOOD + "\n```")))(ctx)
    assert isinstance(p, Proposal) and p.intervention == "drop_dead_groups"


def test_missing_model_or_key_is_a_usage_error_before_any_work(monkeypatch):
    monkeypatch.delenv("OPENAI_MODEL", raising=False)
    with pytest.raises(UsageError, match="llm.model"):
        LLMAgent(LLMConfig(base_url="http://127.0.0.1:9/v1"), "arith")
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(UsageError, match=r"\$OPENAI_API_KEY"):
        LLMAgent(LLMConfig(model="m"), "arith")


def _knob_edit(search: str, replace: str, name: str):
    """A reply that edits the knob the parent's knobs.yaml (shown in the brief) holds."""
    def reply(messages):
        assert search in messages[1]["content"]
        return proposal(name, [{"file": "knobs.yaml", "search": search, "replace": replace}],
                        hypothesis=f"changing {name} improves validation accuracy because the evidence says so")
    return reply


@pytest.mark.slow
def test_a_run_with_the_llm_agent_goes_on_past_every_failure_and_its_lineage_shows_why(tiny_run, serve, capsys):
    bad_json = Say("{'name': 'single quotes are not JSON'}")
    no_match = Say(proposal("lr", [{"file": "knobs.yaml", "search": "lr: 0.5", "replace": "lr: 0.25"}]))
    illegal = Say(proposal("more_steps", [{"file": "knobs.yaml", "search": "steps: 300", "replace": "steps: 900"}]))
    server = serve(Say(_knob_edit("entropy_coef: 0.0", "entropy_coef: 0.001", "entropy_bonus")),
                   bad_json, bad_json, no_match, no_match, illegal, illegal,
                   Say(GOOD, delay_s=3),
                   Say(_knob_edit("temperature: 1.0", "temperature: 1.2", "warmer_sampling")))
    cfg, run = tiny_run
    raw = yaml.safe_load(cfg.read_text())
    raw |= {"agent": "llm", "llm": {"base_url": server.url, "model": "scripted", "timeout_s": 1, "max_retries": 0,
                                    "repair_turns": 1}}
    raw["budget"]["trials"] = 6
    raw["final_seeds"] = []  # the final comparison is tested elsewhere; nothing here reads it
    cfg.write_text(yaml.safe_dump(raw))
    assert main(["run", str(cfg), "--out", str(run), "--json"]) == 0
    st = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    store = LineageStore(run / "lineage.sqlite")
    trials = store.trials()
    labels = [t.label for t in trials]
    assert labels[2:6] == ["unparseable", "patch_failed", "illegal", "agent_timeout"]
    assert labels[1] in ("kept", "discarded") and labels[6] in ("kept", "discarded") and st["state"] == "finished"
    first, last = trials[1], trials[6]
    assert first.hypothesis.startswith("changing entropy_bonus") and "+entropy_coef: 0.001" in first.patch
    assert "+temperature: 1.2" in last.patch and last.agent == "llm"
    assert "+steps: 900" in trials[4].patch and "steps" in trials[4].reflection  # the refused diff is kept
    assert trials[2].version is None and "not valid JSON" in trials[2].reflection
    assert trials[3].intervention == "lr" and trials[3].hypothesis.startswith("changing lr")  # parsed, not applied
    for t in trials[1:]:
        u = t.budgets["agent"]
        assert u["model"] == "scripted" and u["requests"] >= 1
        assert (u["prompt_tokens"] > 0) == (t.label != "agent_timeout")
    assert trials[2].budgets["agent"]["repairs"] == 1 and trials[5].budgets["agent"]["requests"] == 1
    assert st["agent_tokens"]["prompt_tokens"] == sum(t.budgets["agent"]["prompt_tokens"] for t in trials[1:])
    assert len(server.requests) == 9  # every scripted reply was asked for once
    # the last brief shows the lineage: the leaderboard, the path to the best, the best's children
    brief = server.requests[-1]["messages"][1]["content"]
    assert "Leaderboard (kept versions" in brief and "Path from the root to the best: v0 [root]" in brief
    assert "Children of v" in brief
    store.close()


@pytest.mark.slow
def test_an_endpoint_that_keeps_failing_stops_the_run_instead_of_spending_the_budget(tiny_run, serve):
    from evotrainer.config import config_from_dict
    from evotrainer.evolve.controller import Controller
    server = serve(*[Say("<html>502 Bad Gateway</html>", raw=True)] * 5)
    cfg, run = tiny_run
    raw = yaml.safe_load(cfg.read_text()) | {"final_seeds": [], "agent": "llm",
                                             "llm": {"base_url": server.url, "model": "scripted", "max_retries": 0}}
    raw["budget"]["trials"] = 6
    ctl = Controller(config_from_dict(raw).validate(), run)
    ctl.run()
    assert [t.label for t in ctl.store.trials()] == ["kept", "agent_error", "agent_error", "agent_error"]
    stop = ctl.store.events(Stopped)[-1].reason
    assert stop.startswith("the agent failed 3 times in a row") and "not a chat completion" in stop

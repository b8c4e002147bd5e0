"""The `llm` agent: a specialist model behind any OpenAI-compatible chat endpoint.

The official openai SDK is the client, so a hosted API, vLLM, SGLang, Ollama or llama.cpp
all work; the SDK's own timeout and retries with exponential backoff are used, and an
httpx event hook counts the requests, so retries show in the lineage. One proposal is a
short conversation: the system prompt of the specialist the bottleneck calls for, the
brief (health report, lineage view, matching skills, the parent's files), and the reply.
A reply that does not parse, whose edits do not apply, whose code does not compile or
whose edit is illegal is sent back with the reason, `repair_turns` times at most; then
the trial gets that label. A reply slower than the timeout (after retries) is
`agent_timeout`, any other API failure `agent_error`. The run never crashes on a reply.
"""
from __future__ import annotations

import json
import os
import time

from evotrainer.agents.brief import brief, specialist_for, system_prompt
from evotrainer.agents.interface import AgentContext, AgentFailed, Proposal
from evotrainer.agents.edits import ReplyError, apply_edits, check_changed, harness_files, parse_reply
from evotrainer.config import LLMConfig
from evotrainer.errors import UsageError
from evotrainer.skills import signature


class NotACompletion(ValueError):
    """The endpoint answered 200 with something that is not a chat completion."""


class LLMAgent:
    def __init__(self, cfg: LLMConfig, task: str):
        import openai
        self.cfg, self.task = cfg, task
        self.model = cfg.model or os.environ.get("OPENAI_MODEL")
        if not self.model:
            raise UsageError("config: 'llm.model' is not set and neither is $OPENAI_MODEL; name the model the "
                             "endpoint serves")
        base_url = cfg.base_url or os.environ.get("OPENAI_BASE_URL")
        key = os.environ.get(cfg.api_key_env)
        if not key and not base_url:
            raise UsageError(f"config: agent 'llm' needs an API key in ${cfg.api_key_env} or a local server's "
                             "'llm.base_url'")
        self.requests = 0  # every HTTP request the SDK sends, retries included
        self.client = openai.OpenAI(
            base_url=base_url, api_key=key or "none", timeout=cfg.timeout_s, max_retries=cfg.max_retries,
            http_client=openai.DefaultHttpxClient(event_hooks={"request": [self._count]}))

    def _count(self, request) -> None:
        self.requests += 1

    def __call__(self, ctx: AgentContext) -> Proposal | AgentFailed:
        import openai
        role = specialist_for(ctx)
        messages = [{"role": "system", "content": system_prompt(role)},
                    {"role": "user", "content": brief(ctx, role, self.task)}]
        usage = {"agent": "llm", "model": self.model, "role": role, "calls": 0, "requests": 0, "repairs": 0,
                 "prompt_tokens": 0, "completion_tokens": 0, "seconds": 0.0}
        files = harness_files(ctx.harness_dir)
        result: Proposal | AgentFailed | None = None
        for turn in range(self.cfg.repair_turns + 1):
            try:
                text = self._complete(messages, usage)
            except openai.APITimeoutError:
                result = self._failed("agent_timeout", f"no reply within {self.cfg.timeout_s:g} s after "
                                      f"{usage['requests']} requests", usage)
                break
            except openai.APIError as e:
                result = self._failed("agent_error", f"{type(e).__name__}: {e}", usage)
                break
            except ValueError as e:  # a 200 whose body is not JSON (the SDK's decoder) or not a completion
                result = self._failed("agent_error", f"the endpoint's answer is not a chat completion: {e}", usage)
                break
            messages.append({"role": "assistant", "content": text})
            reply = None
            try:
                reply = parse_reply(text)
                changed = apply_edits(files, reply.edits)
                try:
                    check_changed(ctx.harness_dir, changed)
                except ReplyError as e:
                    if e.label != "illegal" or turn < self.cfg.repair_turns:
                        raise
                    # the last word is illegal: the controller commits it and labels it, so the
                    # lineage shows the exact diff that was refused
                result = Proposal(
                    reply.name, role, reply.hypothesis, "every other knob and slot of the parent",
                    reply.success_criterion, reply.rollback, files=changed, agent="llm",
                    trigger=signature(ctx.findings[0]) if ctx.findings else "none",
                    expected=reply.expected_effect, usage=usage)
                break
            except ReplyError as e:  # what the model meant is kept where the reply parsed
                result = self._failed(e.label, str(e), usage, reply)
                if turn < self.cfg.repair_turns:
                    usage["repairs"] += 1
                    messages.append({"role": "user", "content": f"Your reply cannot be used: {e}. Send the whole "
                                                                "JSON object again, corrected."})
        self._keep_transcript(ctx, messages, usage)
        return result

    def _complete(self, messages: list[dict], usage: dict) -> str:
        t, before = time.time(), self.requests
        extra = {self.cfg.token_limit: self.cfg.max_tokens}
        if self.cfg.json_mode:
            extra["response_format"] = {"type": "json_object"}
        try:
            r = self.client.chat.completions.create(model=self.model, messages=messages,
                                                    temperature=self.cfg.temperature, **extra)
        finally:
            usage["calls"] += 1
            usage["requests"] += self.requests - before
            usage["seconds"] = round(usage["seconds"] + time.time() - t, 3)
        if getattr(r, "choices", None) is None:  # a 200 that is not a chat completion at all
            raise NotACompletion(f"it answered {str(r)[:200]!r}")
        if r.usage is not None:
            usage["prompt_tokens"] += r.usage.prompt_tokens or 0
            usage["completion_tokens"] += r.usage.completion_tokens or 0
        return (r.choices[0].message.content or "") if r.choices else ""

    def _failed(self, label: str, reason: str, usage: dict, reply=None) -> AgentFailed:
        if reply is not None:
            return AgentFailed(label, reason, "llm", reply.name, reply.hypothesis, usage)
        return AgentFailed(label, reason, "llm", f"llm_{usage['role']}", usage=usage)

    @staticmethod
    def _keep_transcript(ctx: AgentContext, messages: list[dict], usage: dict) -> None:
        """The whole conversation beside the run, so a reader sees what the model was told and said."""
        if ctx.workdir is None:
            return
        ctx.workdir.mkdir(parents=True, exist_ok=True)
        path = ctx.workdir / f"trial-{ctx.trial}-llm.json"
        n = 1
        while path.exists():  # a revised proposal keeps the first conversation too
            n += 1
            path = ctx.workdir / f"trial-{ctx.trial}-llm-{n}.json"
        path.write_text(json.dumps({"usage": usage, "messages": messages}, indent=2))
        usage["transcript"] = str(path)

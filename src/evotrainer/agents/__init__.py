"""Trainer agents: they read evidence and propose one single-variable intervention."""
from __future__ import annotations

from evotrainer.agents.interface import Agent, AgentContext, AgentFailed, Escalation, Proposal
from evotrainer.agents.interventions import INTERVENTIONS, set_knob
from evotrainer.agents.rules import propose, propose_random

AGENTS = {"rules": propose, "random": propose_random}


def make_agent(cfg) -> Agent:
    """The config's agent (agents/interface.py: `AgentContext -> Proposal | AgentFailed | None`); the
    llm and command agents check their settings here, before any work."""
    if cfg.agent == "llm":
        from evotrainer.agents.llm import LLMAgent
        return LLMAgent(cfg.llm, f"{cfg.task} level {cfg.level}")
    if cfg.agent == "command":
        from evotrainer.agents.command import CommandAgent
        return CommandAgent(cfg.command, f"{cfg.task} level {cfg.level}")
    return AGENTS[cfg.agent]


__all__ = ["AGENTS", "INTERVENTIONS", "Agent", "AgentContext", "AgentFailed", "Escalation", "Proposal", "make_agent",
           "propose", "propose_random", "set_knob"]

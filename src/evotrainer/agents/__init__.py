"""Trainer agents: they read evidence and propose one single-variable intervention."""
from evotrainer.agents.catalog import CATALOG, Proposal, set_knob
from evotrainer.agents.rules import AgentContext, Escalation, propose, propose_random

AGENTS = {"rules": propose, "random": propose_random}

__all__ = ["AGENTS", "AgentContext", "CATALOG", "Escalation", "Proposal", "propose", "propose_random", "set_knob"]

"""Trainer agents: they read evidence and propose one single-variable intervention."""
from evotrainer.agents.catalog import CATALOG, Proposal, set_knob
from evotrainer.agents.rules import propose

__all__ = ["CATALOG", "Proposal", "propose", "set_knob"]

"""The rules agent: offline and deterministic. Findings in, one intervention out.

It reads the parent's health-report findings worst first, maps each to the intervention
family its suggestion names ("reward: ...", "group_filter: ..."), and proposes the
first catalog entry of that family that applies and was not tried from this parent
yet. With no finding left to act on it walks the families in a fixed order, so it always
has a next idea until the catalog is spent (None).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Mapping

from evotrainer.agents.catalog import CATALOG, FAMILY, Proposal
from evotrainer.harness.knobs import Knobs

FAMILY_ORDER = ("reward_hacking", "reward", "group_filter", "signal", "curriculum", "exploration",
                "optimisation", "efficiency")


def family_of(suggestion: str) -> str | None:
    """'reward hacking: simplify ...' -> 'reward_hacking'; 'group_filter: drop ...' -> 'group_filter'."""
    head = suggestion.split(":", 1)[0].strip().replace(" ", "_")
    return head if head in FAMILY_ORDER else None


def propose(findings: Iterable[Mapping], knobs: Knobs, target_level: int, tried: set[str] = frozenset()) -> Proposal | None:
    findings = list(findings)
    families = [f for f in (family_of(x.get("suggest", "")) for x in findings) if f]
    order = list(dict.fromkeys(families + list(FAMILY_ORDER)))
    for family in order:
        for name, fam in FAMILY.items():
            if fam != family or name in tried:
                continue
            p = CATALOG.get(name)(knobs, target_level)
            if p is None:
                continue
            why = next((x for x in findings if family_of(x.get("suggest", "")) == family), None)
            if why is not None:  # the finding this answers is the evidence of the hypothesis
                p = replace(p, hypothesis=f"{p.hypothesis} (evidence: {why['evidence']})")
            return p
    return None

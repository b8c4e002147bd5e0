"""The brief a code-writing agent reads (llm, command): rendered from the template files in
agents/prompts/, never from strings in code, so a user can read and change what the agent
is told. The specialist role is chosen by the current bottleneck: the surface the parent's
worst finding points at.
"""
from __future__ import annotations

from pathlib import Path
from string import Template

from evotrainer.agents.edits import harness_files
from evotrainer.agents.interface import AgentContext
from evotrainer.agents.rules import family_of
from evotrainer.skills import Conditions, matching, standing

PROMPTS = Path(__file__).resolve().parent / "prompts"
# specialist role -> the intervention families (findings' suggestions) it answers
SPECIALISTS: dict[str, tuple[str, ...]] = {
    "reward": ("reward", "reward_hacking", "efficiency"),
    "signal": ("group_filter", "signal"),
    "optimisation": ("optimisation",),
    "exploration": ("exploration",),
    "curriculum": ("curriculum",),
    "diagnostics": (),
}


def specialist_for(ctx: AgentContext) -> str:
    """The role the worst actionable finding calls for; `diagnostics` when the findings point
    nowhere or the diagnostics themselves were found to mislead (an escalation ignores them).
    A role whose surface a trial in flight is changing from this parent is not chosen."""
    open_ = [role for role in SPECIALISTS if role not in ctx.closed]  # another trial in flight has the rest
    if ctx.escalation and ctx.escalation.ignore and "diagnostics" in open_:
        return "diagnostics"
    for f in ctx.findings:
        family = family_of(f.get("suggest", ""))
        for role in open_:
            if family in SPECIALISTS[role] and (not ctx.escalation or family not in ctx.escalation.avoid):
                return role
    return "diagnostics" if "diagnostics" in open_ or not open_ else open_[0]


def template(name: str) -> Template:
    return Template((PROMPTS / name).read_text())


def system_prompt(role: str) -> str:
    from evotrainer.harness.legality import BUDGET_KNOBS, HARNESS_FILES
    return template("system.md").substitute(
        role=role, specialist=(PROMPTS / "specialists" / f"{role}.md").read_text().strip(),
        slot_files=", ".join(sorted(f for f in HARNESS_FILES if f.endswith(".py"))),
        budget_knobs=", ".join(BUDGET_KNOBS))


def brief(ctx: AgentContext, role: str, task: str) -> str:
    files = harness_files(ctx.harness_dir) if ctx.harness_dir else {}
    esc = ctx.escalation
    return template("brief.md").substitute(
        trial=ctx.trial, parent=ctx.parent, task=task, role=role,
        feedback=f"\n## A person reviewed the last proposal and asks\n{ctx.feedback}\n" if ctx.feedback else "",
        findings="\n".join(_finding(f) for f in ctx.findings) or "(no findings)",
        lineage=ctx.lineage or "(only the root so far)",
        skills=skills_shown(ctx) or "(none yet)",
        tried=", ".join(sorted(ctx.tried)) or "(nothing)",
        escalation=(f"\n## Escalation: three failures in a row\nLeave the surfaces that failed "
                    f"({', '.join(sorted(esc.avoid - {'other'})) or 'see the lineage'}); prefer undoing a change "
                    "over adding one.\n") if esc else "",
        choices=_choices(),
        files="\n".join(f"### {name}\n```\n{text}```" for name, text in files.items()))


def _finding(f) -> str:
    return (f"- {f['diagnostic']} [{f['severity']}{', blocking' if f.get('blocking') else ''}] = {f['value']:g}: "
            f"{f.get('evidence', '')} -> {f.get('suggest', '')}")


def skills_shown(ctx: AgentContext, most: int = 8) -> str:
    """The skills matching the findings, weighed for this run as the rules agent weighs them
    (skills.standing: each outcome by how close its task, level, accuracy band and backend are
    to this run's), best first, each with where its evidence comes from."""
    here = Conditions(ctx.task, ctx.target_level, ctx.reference_acc, ctx.backend)
    weighed = [(standing(s, here), s) for s in matching(ctx.skills, ctx.findings)]
    weighed.sort(key=lambda x: -(x[0] if x[0] is not None else 0.0))
    return "\n".join(_skill(s, expect, here) for expect, s in weighed[:most])


def _skill(s, expect: float | None, here: Conditions) -> str:
    gain = "n/a" if s.mean_gain is None else f"{s.mean_gain:+.3f}"
    own = sum(o["task"] == here.task for o in s.evidence)
    return (f"- {s.name}: expects {'n/a' if expect is None else f'{expect:+.3f}'} here "
            f"({own} of its {s.tried} outcomes on this task); kept {s.kept}, mean gain {gain} everywhere, "
            f"held on {', '.join(s.held_on) or '-'}")


def _choices() -> str:
    from evotrainer.harness.load import SLOTS
    return "\n".join(f"- {knob}: {', '.join(reg.names())}" for knob, reg in SLOTS.items())

"""The `command` agent: an external coding agent (any CLI) edits a copy of the parent's harness.

The command runs in a fresh git repository holding exactly the parent's files (a worktree
of its own: a coding agent sees a clean checkout and can `git diff` its work, and its git
commands act on that repository, never on the run's, whose tags are the lineage; it runs
as the user's own tool, with the user's rights, not in a sandbox). The brief, the
same the llm agent reads, is written to a file and sent on stdin; the command line may
name {brief}, {worktree} and {proposal}. Whatever it changed is the patch; it may write its
hypothesis as JSON (the llm reply's fields, without edits) to {proposal}. It runs in its
own process group, killed whole past `timeout_s`; its output is kept beside the run.
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

from evotrainer.agents.brief import brief, specialist_for, system_prompt
from evotrainer.agents.interface import AgentContext, AgentFailed, Proposal
from evotrainer.agents.edits import ReplyError, check_changed, harness_files
from evotrainer.config import CommandConfig
from evotrainer.skills import signature
from evotrainer.harness.versions import HarnessRepo

TAIL = 4000  # characters of the command's output kept in the lineage


class CommandAgent:
    def __init__(self, cfg: CommandConfig, task: str):
        self.cfg, self.task = cfg, task

    def __call__(self, ctx: AgentContext) -> Proposal | AgentFailed:
        role = specialist_for(ctx)
        work = _fresh(Path(ctx.workdir or ".") / f"trial-{ctx.trial}-command")
        tree = work / "worktree"
        HarnessRepo.init(tree, ctx.harness_dir)
        brief_file, proposal_file, log = work / "brief.md", work / "proposal.json", work / "output.log"
        brief_file.write_text(system_prompt(role) + "\n\n" + brief(ctx, role, self.task) +
                              f"\n\nEdit the files in {tree} in place. Write your proposal (the JSON fields above, "
                              f"without `edits`) to {proposal_file}.\n")
        line = self.cfg.run
        for key, path in (("{brief}", brief_file), ("{worktree}", tree), ("{proposal}", proposal_file)):
            line = line.replace(key, shlex.quote(str(path)))
        usage = {"agent": "command", "role": role, "command": line, "output": str(log)}
        t = time.time()
        with open(brief_file, "rb") as stdin, open(log, "wb") as out:
            p = subprocess.Popen(line, shell=True, cwd=tree, stdin=stdin, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
            try:
                rc = p.wait(timeout=self.cfg.timeout_s)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)  # the whole group: a CLI's own children too
                except ProcessLookupError:  # it ended just now
                    pass
                p.wait()
                rc = None
        usage |= {"seconds": round(time.time() - t, 3), "exit": rc}
        tail = log.read_text(errors="replace")[-TAIL:]
        if rc is None:
            return AgentFailed("agent_timeout", f"killed after {self.cfg.timeout_s:g} s; output: {tail}", "command",
                               "command", usage=usage)
        if rc != 0:
            return AgentFailed("agent_error", f"exit {rc}; output: {tail}", "command", "command", usage=usage)
        changed = _changed(harness_files(ctx.harness_dir), tree)
        if not changed:
            return AgentFailed("patch_failed", "the command changed no harness file", "command", "command",
                               usage=usage)
        try:  # a syntax error is its own label; the controller judges legality on the committed child
            check_changed(ctx.harness_dir, {f: t for f, t in changed.items() if t is not None and "/" not in f})
        except ReplyError as e:
            if e.label != "illegal":
                return AgentFailed(e.label, str(e), "command", "command", usage=usage)
        said = _said(proposal_file)
        return Proposal(
            said.get("name", "command_edit"), role,
            said.get("hypothesis", f"(the command gave no hypothesis) output: {tail[-500:]}"),
            "every file the command left alone", said.get("success_criterion", "validation accuracy beats the "
                                                          "control's beyond the noise floor"),
            said.get("rollback", "back to the parent"), files=changed, agent="command",
            trigger=signature(ctx.findings[0]) if ctx.findings else "none",
            expected=said.get("expected_effect", ""), usage=usage)


def _fresh(path: Path) -> Path:
    """A new directory for this call (a revised proposal keeps the first call's files)."""
    n, out = 1, path
    while out.exists():
        n += 1
        out = path.with_name(f"{path.name}-{n}")
    out.mkdir(parents=True)
    return out


def _changed(before: dict[str, str], tree: Path) -> dict[str, str | None]:
    """Every file the command wrote, added (subdirectories too, for legality to refuse) or removed;
    byproducts of tools are left out: dotfiles and dot-directories (.git, an agent's own state)
    and __pycache__."""
    after = {}
    for d, dirs, files in os.walk(tree):
        dirs[:] = [x for x in dirs if not x.startswith(".") and x != "__pycache__"]
        for f in (f for f in files if not f.startswith(".")):
            p = Path(d, f)
            after[p.relative_to(tree).as_posix()] = p.read_text(errors="replace")
    out: dict[str, str | None] = {f: t for f, t in after.items() if before.get(f) != t}
    out |= {f: None for f in before if f not in after}
    return out


def _said(path: Path) -> dict[str, str]:
    """The command's own account of its proposal: string fields only; anything else is ignored."""
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(obj, dict):
        return {}
    return {k: v.strip() for k, v in obj.items() if isinstance(v, str) and v.strip()}

"""From a model's reply to the new harness files, or the one reason it cannot be used.

A reply is one JSON object (the schema in agents/prompts/system.md): a short name, the
hypothesis, the expected effect, the success criterion, the rollback, and `edits`, a list
of search/replace blocks on the parent's harness files (aider-style: `search` must occur
exactly once in the file; an empty `search` creates a new file). Each check names what
went wrong in words a model can act on, with the label the trial gets if the repair turns
run out: `unparseable`, `patch_failed`, `syntax_error` or `illegal`. Nothing here runs
the code it reads; legality is the same static check the controller applies.
"""
from __future__ import annotations

import ast
import json
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from evotrainer.harness.legality import check_harness, check_patch_paths

FIELDS = ("name", "hypothesis", "expected_effect", "success_criterion", "rollback", "edits")


class ReplyError(ValueError):
    """A reply that cannot become a candidate: `label` is the trial's label if it stays so."""

    def __init__(self, label: str, message: str):
        self.label = label
        super().__init__(message)


@dataclass(frozen=True)
class Edit:
    file: str
    search: str
    replace: str


@dataclass(frozen=True)
class Reply:
    name: str
    hypothesis: str
    expected_effect: str
    success_criterion: str
    rollback: str
    edits: tuple[Edit, ...]


def parse_reply(text: str) -> Reply:
    """The reply's JSON object (a ```json fence or a <think> block around it is tolerated),
    checked field by field."""
    body = re.sub(r"<think>.*?</think>", "", text, flags=re.S).strip()  # reasoning models' preamble
    fence = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", body, re.S)
    if fence:
        body = fence.group(1)
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        raise ReplyError("unparseable", f"the reply is not valid JSON ({e.msg} at line {e.lineno}, "
                                        f"column {e.colno}); reply with the JSON object only") from None
    if not isinstance(obj, dict):
        raise ReplyError("unparseable", f"the reply must be a JSON object with keys {', '.join(FIELDS)}")
    missing = [k for k in FIELDS if k not in obj]
    if missing:
        raise ReplyError("unparseable", f"the reply lacks {', '.join(missing)}; every one of {', '.join(FIELDS)} "
                                        "is required")
    text_fields = [k for k in FIELDS[:-1] if not isinstance(obj[k], str) or not obj[k].strip()]
    if text_fields:
        raise ReplyError("unparseable", f"{', '.join(text_fields)} must be non-empty strings")
    edits = obj["edits"]
    if not isinstance(edits, list) or not edits:
        raise ReplyError("unparseable", "edits must be a non-empty list of {file, search, replace} objects")
    out = []
    for i, e in enumerate(edits):
        if not isinstance(e, dict) or not all(isinstance(e.get(k), str) for k in ("file", "search", "replace")):
            raise ReplyError("unparseable", f"edits[{i}] must be an object with string fields file, search, replace")
        out.append(Edit(e["file"], e["search"], e["replace"]))
    name = re.sub(r"[^a-z0-9_]+", "_", obj["name"].strip().lower()).strip("_")[:48] or "llm_edit"
    return Reply(name, obj["hypothesis"].strip(), obj["expected_effect"].strip(), obj["success_criterion"].strip(),
                 obj["rollback"].strip(), tuple(out))


def apply_edits(files: dict[str, str], edits: tuple[Edit, ...]) -> dict[str, str]:
    """The files the edits change, with their new text (the others are left out)."""
    bad = check_patch_paths([e.file for e in edits])
    if bad:
        raise ReplyError("illegal", "; ".join(bad))
    new = dict(files)
    for i, e in enumerate(edits):
        if e.search == "":
            if e.file in new:
                raise ReplyError("patch_failed", f"edits[{i}]: {e.file} exists; an empty search only creates "
                                                 "a new file, quote the text to replace instead")
            new[e.file] = e.replace
            continue
        if e.file not in new:
            raise ReplyError("patch_failed", f"edits[{i}]: no file {e.file} in the harness; files: "
                                             f"{', '.join(sorted(files))}")
        count = new[e.file].count(e.search)
        if count != 1:
            where = "does not occur" if count == 0 else f"occurs {count} times"
            raise ReplyError("patch_failed", f"edits[{i}]: the search text {where} in {e.file}; copy it exactly "
                                             "(whitespace included) from the file as shown, enough to be unique")
        new[e.file] = new[e.file].replace(e.search, e.replace, 1)
    changed = {f: t for f, t in new.items() if files.get(f) != t}
    if not changed:
        raise ReplyError("patch_failed", "the edits change nothing")
    return changed


def check_changed(parent_dir: Path, changed: dict[str, str]) -> None:
    """Syntax of every changed Python file, then the controller's legality rules on the child."""
    for f, text in sorted(changed.items()):
        if f.endswith(".py"):
            try:
                ast.parse(text, filename=f)
            except SyntaxError as e:
                raise ReplyError("syntax_error", f"{f}:{e.lineno}: syntax error: {e.msg}") from None
    with tempfile.TemporaryDirectory(prefix="evotrainer-edit-") as tmp:
        child = Path(tmp) / "child"
        child.mkdir()
        for p in Path(parent_dir).iterdir():
            if p.is_file():
                (child / p.name).write_bytes(p.read_bytes())
        for f, text in changed.items():
            (child / f).write_text(text)
        verdict = check_harness(child, parent_dir)
    if not verdict.legal:
        raise ReplyError("illegal", "; ".join(verdict.reasons))


def harness_files(harness_dir: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(Path(harness_dir).iterdir()) if p.is_file()}

"""A proposed harness change, from patch to a labelled candidate version.

A patch is checked for where it writes (only harness files), committed as a child of its
parent version so its exact diff stays in the run's history, and the child's files are
checked for legality against the parent's. An illegal child keeps its commit (the
lineage shows what was proposed) but is labelled `illegal` and never runs. Nothing here
runs the candidate's code.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from evotrainer.harness.legality import check_harness, check_patch, check_patch_paths
from evotrainer.harness.versions import HarnessRepo


@dataclass(frozen=True)
class Candidate:
    version: str | None      # the child's version; None when the patch was refused before committing
    label: str               # legal | illegal
    reasons: list[str]

    @property
    def legal(self) -> bool:
        return self.label == "legal"


def propose(repo: HarnessRepo, parent: str, patch: str, version: str, message: str = "") -> Candidate:
    """Vet `patch` against `parent`; raises PatchError if it does not apply (not a legality matter)."""
    reasons = check_patch(patch)
    if reasons:
        return Candidate(None, "illegal", reasons)
    repo.create_child(parent, patch, version, message or version)
    return vet(repo, parent, version)


def propose_files(repo: HarnessRepo, parent: str, files: dict[str, str | None], version: str,
                  message: str = "") -> Candidate:
    """The same for whole files written into (str) or removed from (None) the parent's harness."""
    reasons = check_patch_paths(list(files))
    if reasons:
        return Candidate(None, "illegal", reasons)
    repo.create_child_from_files(parent, files, version, message or version)
    return vet(repo, parent, version)


def vet(repo: HarnessRepo, parent: str, version: str) -> Candidate:
    """Label an already committed child: its files checked against its parent's."""
    with tempfile.TemporaryDirectory(prefix="evotrainer-vet-") as tmp:
        parent_dir = repo.checkout(parent, Path(tmp) / "parent")
        child_dir = repo.checkout(version, Path(tmp) / "child")
        verdict = check_harness(child_dir, parent_dir)
    return Candidate(version, "legal" if verdict.legal else "illegal", verdict.reasons)

"""The run's harness versions on disk: one git tag per version in RUN/harness-repo, checked out
once into RUN/harnesses/vN when something first reads it, and a new version made from a
parent's (committed, then vetted: legal, and trainable by this run's backend).
"""
from __future__ import annotations

import dataclasses
import shutil
import threading
from pathlib import Path

from evotrainer.agents import set_knob
from evotrainer.errors import UsageError
from evotrainer.harness import inspect_harness
from evotrainer.harness.candidate import Candidate, propose_files, vet
from evotrainer.harness.knobs import Knobs, load_knobs, read_yaml
from evotrainer.harness.versions import HarnessRepo
from evotrainer.runtime import Runtime
from evotrainer.trainer.backends import check_backend


class Harnesses:
    def __init__(self, repo: HarnessRepo, run_dir: Path, runtime: Runtime):
        self.repo, self.run_dir, self.runtime = repo, run_dir, runtime
        self._lock = threading.Lock()  # two trials in flight may ask for one parent's checkout at once

    def dir(self, version: str) -> Path:
        """A version's harness, checked out (once: a checkout is whole or absent)."""
        d = self.run_dir / "harnesses" / version
        with self._lock:
            if not d.exists():
                tmp = d.with_name(version + ".tmp")
                shutil.rmtree(tmp, ignore_errors=True)
                self.repo.checkout(version, tmp)
                tmp.rename(d)
        return d

    def knobs(self, version: str) -> Knobs:
        return load_knobs(self.dir(version) / "knobs.yaml")

    def files(self, version: str) -> tuple[dict, dict[str, str]]:
        """A version's knobs and its slot files (a crossover merges them)."""
        d = self.dir(version)
        return (read_yaml((d / "knobs.yaml").read_text()) or {},
                {p.name: p.read_text() for p in sorted(d.glob("*.py"))})

    def candidate(self, parent: str, version: str, knobs: dict, files: dict, hypothesis: str) -> Candidate:
        """`version`: `parent`'s harness with `knobs` set and `files` replaced, committed and vetted
        (legal, and this run's backend can train it). PatchError where it changes nothing."""
        if version in self.repo.versions():  # a resumed trial: the child was committed before the kill
            cand = vet(self.repo, parent, version)
        else:
            text = files.get("knobs.yaml") or (self.dir(parent) / "knobs.yaml").read_text()
            for key, value in knobs.items():
                text = set_knob(text, key, value)
            cand = propose_files(self.repo, parent, {**files, "knobs.yaml": text}, version, hypothesis)
        if not cand.legal:
            return cand
        try:  # legal, but this run's backend must be able to train it as written
            check_backend(self.runtime, inspect_harness(self.dir(version)), version)
        except UsageError as e:
            return dataclasses.replace(cand, label="illegal", reasons=[str(e)])
        return cand

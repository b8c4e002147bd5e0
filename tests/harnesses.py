"""Small harness directories for tests: the reference recipe with some knobs and slot files changed."""
import shutil
import textwrap

import yaml

from evotrainer.harness import REFERENCE


def write_harness(path, files: dict | None = None, **knobs):
    """The reference harness at `path`, at a test's batch shape (4 x 4) unless knobs say otherwise."""
    shutil.copytree(REFERENCE, path)
    raw = yaml.safe_load((path / "knobs.yaml").read_text())
    raw.update({"prompts_per_step": 4, "group_size": 4, **knobs})
    (path / "knobs.yaml").write_text(yaml.safe_dump(raw))
    for name, body in (files or {}).items():
        (path / name).write_text(textwrap.dedent(body))
    return path

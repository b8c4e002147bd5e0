"""The user documentation stays true to the code: every trial label is explained, every
relative link points at a file that exists, and every extra the docs tell a user to install
exists in pyproject.toml."""
import re
import tomllib
from pathlib import Path

from evotrainer.labels import Label

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_label_is_explained_in_the_concepts_page():
    text = (ROOT / "docs" / "concepts.md").read_text()
    missing = [label.value for label in Label if f"| `{label.value}` |" not in text]
    assert missing == []


def test_every_relative_link_resolves():
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text()):
            if not target.startswith(("http://", "https://")) and not (page.parent / target).exists():
                broken.append(f"{page.name}: {target}")
    assert broken == []


def test_every_extra_the_docs_name_exists():
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    named = {m for page in PAGES for m in re.findall(r"evotrainer\[([a-z]+)\]", page.read_text())}
    named |= {m for page in PAGES for m in re.findall(r"pip install -e \.\[([a-z]+)\]", page.read_text())}
    assert named and named <= extras, named - extras

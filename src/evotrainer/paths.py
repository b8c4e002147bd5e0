"""Where evotrainer keeps what outlives a run, as the XDG base directory spec says: cached
bases and their split keys in `$XDG_CACHE_HOME/evotrainer` (default ~/.cache/evotrainer),
the skill library in `$XDG_DATA_HOME/evotrainer` (default ~/.local/share/evotrainer). Read
once, at import: a process started with other values uses its own.
"""
from __future__ import annotations

import os
from pathlib import Path


def xdg_dir(var: str, default: str) -> Path:
    """`$var/evotrainer`, or `~/<default>/evotrainer` where `var` is unset, empty or a
    relative path (which the spec says to ignore)."""
    base = os.environ.get(var, "")
    return (Path(base) if os.path.isabs(base) else Path.home() / default) / "evotrainer"


CACHE = xdg_dir("XDG_CACHE_HOME", ".cache")
DATA = xdg_dir("XDG_DATA_HOME", ".local/share")

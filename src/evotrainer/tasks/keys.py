"""The split secret: which held-out problems are validation and test depends on a key no
harness code sees (the held-out pool itself is public, tasks/base.py says why).

One key per *base*, not per run: every run on a base scores the same validation and test
problems, so their results compare and a resume finds its own. A key is 32 random bytes in
`<cache>/keys/<name>.key`, mode 0600 in a 0700 directory; the sandbox hides that directory
from every job (launch.py, `conceal`), and only the evaluator receives a key, as an argument.
"""
from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

from evotrainer.paths import CACHE as DEFAULT_CACHE  # $XDG_CACHE_HOME/evotrainer


def key_dir(cache_dir: Path | None = None) -> Path:
    return Path(cache_dir or DEFAULT_CACHE) / "keys"


def key_path(identity: str, cache_dir: Path | None = None) -> Path:
    return key_dir(cache_dir) / f"{hashlib.sha256(identity.encode()).hexdigest()[:24]}.key"


def split_key(identity: str, cache_dir: Path | None = None) -> bytes:
    """The key of the base `identity` names (a cached base's directory name, or a model path
    with the task): read, or made once and kept."""
    path = key_path(identity, cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    if not path.exists():
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        try:
            os.link(tmp, path)  # first writer wins: two runs starting at once agree on one key
        except FileExistsError:
            pass
        tmp.unlink()
    return bytes.fromhex(path.read_text().strip())


def key_digest(key: bytes | None) -> str | None:
    """A short fingerprint a run records, so that a resume can tell its key is the same."""
    return None if key is None else hashlib.sha256(b"evotrainer split key/" + key).hexdigest()[:16]

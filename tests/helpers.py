"""What many tests build or look for, one copy each: harness directories and run configs,
files a sandboxed job may read, processes left behind, the command line (in-process and as a
user starts it), and what an agent is shown."""
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple

import yaml

from evotrainer.agents import AgentContext
from evotrainer.cli import main
from evotrainer.harness import REFERENCE
from evotrainer.harness.knobs import load_knobs

# ---------------------------------------------------------------------------- harnesses

# a reward slot a random-init policy can learn in a few dozen steps: tests of learning use it
DIGITS = """
    import torch

    def digit_share(r):
        # share of completion characters that are digits: learnable from a random init
        return torch.tensor([sum(c.isdigit() for c in t) / max(len(t), 1) for t in r.completions])
"""


def write_harness(path: Path, files: dict | None = None, *, small: bool = True, rewrite: bool = False,
                  **knobs) -> Path:
    """A copy of the reference harness at `path`, with `knobs` set and slot `files` (name ->
    source, dedented) added; a "knobs.yaml" in `files` replaces the knobs file whole.

    small: a test's batch of 4 prompts x 4 (16 rollouts a step, not 512); False keeps the
    reference's 64 x 8, which evidence written at the reference shape and budget checks
    against a parent compare with.

    The bytes matter, not only the values: a training job's sampling seed hashes the harness
    files (sampling_seed in trainer/jobs.py), so a test whose check rides on one draw keeps the
    bytes it was written against. By default each knob is set on its own line, the reference's
    comments and order kept (agents and legality checks read that text); rewrite=True writes
    knobs.yaml as one sorted mapping without comments, as test_real_use's harnesses always were."""
    shutil.copytree(REFERENCE, path)
    knobs = ({"prompts_per_step": 4, "group_size": 4} if small else {}) | knobs
    text = (path / "knobs.yaml").read_text()
    if rewrite:
        text = yaml.safe_dump(yaml.safe_load(text) | knobs)
    else:
        lines = text.splitlines()
        for k, v in knobs.items():
            line = f"{k}: " + yaml.safe_dump(v, default_flow_style=True).removesuffix("...\n").strip()
            at = [i for i, old in enumerate(lines) if old.startswith(f"{k}:")]
            if at:
                lines[at[0]] = line
            else:
                lines.append(line)
        text = "\n".join(lines) + "\n"
    (path / "knobs.yaml").write_text(text)
    for name, body in (files or {}).items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(textwrap.dedent(body))
    return path


def readable(path: Path) -> Path:
    """pytest makes its temporary directories 0700 (and transformers writes weights 0600); a
    sandboxed job runs as nobody when the tests run as root, so what a job reads must be
    readable by others, as under umask 022."""
    os.chmod(path, 0o755)
    for sub in path.rglob("*"):
        sub.chmod(sub.stat().st_mode | (0o055 if sub.is_dir() else 0o044))
    return path


def tiny_run_config(tmp_path: Path, ckpt: Path) -> tuple[Path, Path]:
    """A run config over a small root harness and a random-init base (plumbing, not learning),
    and where its run goes."""
    root = write_harness(tmp_path / "root")
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"task: arith\nlevel: 1\nharness: {root}\nseeds: [0]\nfinal_seeds: [100]\n"
                   f"model: {ckpt}\nsearch: {{skills: {tmp_path / 'skills.sqlite'}}}\n"
                   "budget: {trials: 2, steps_per_segment: 2, total_steps: 6, trial_timeout_s: 120}\n"
                   "evaluation: {every: 1}\n"   # 2-step segments: a checkpoint after step 1 too
                   "promotion: {replicas: 1}\n")     # the least the gate needs with one seed: plumbing, not gains
    return cfg, tmp_path / "run"


# ---------------------------------------------------------------------------- processes


def processes_with(marker: str) -> list[int]:
    """Live processes whose command line holds `marker` (zombies are gone for this purpose)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmd and state not in ("Z", "X") and int(pid) != os.getpid():
            out.append(int(pid))
    return out


# ---------------------------------------------------------------------------- the command line
# In-process (`run_cli`) is quick and shows what `main` returns and prints; a subprocess
# (`cli`, `start_cli`) is what a user runs: exit codes, tracebacks, workers, being killed.


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    """`evotrainer ARGV` in this process: exit code, stdout, stderr."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def here(capsys, *argv, code: int = 0) -> "Ran":
    """`cli` in this process, for a test whose subject is not the command line itself: the
    same exit-code check and output, without a new interpreter importing torch and
    transformers (about 6 s a call). Training and evaluation still run in their workers."""
    got, out, err = run_cli(capsys, *argv)
    assert got == code, err[-3000:]
    return Ran(out, err)


def start_cli(*args, **popen) -> subprocess.Popen:
    """`python -m evotrainer.cli ARGS` started as a user starts it: no stdin, in a session of its
    own (a test may kill it and its workers as one group), with this process's sys.path (a
    user's task module beside the tests imports in every worker)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.Popen([sys.executable, "-m", "evotrainer.cli", *map(str, args)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, env=env, **popen)


class Ran(NamedTuple):
    out: str
    err: str

    @property
    def json(self) -> dict:
        """The command's summary: the last line of its stdout."""
        return json.loads(self.out.strip().splitlines()[-1])


def cli(*args, code: int = 0, cwd=None, timeout: float = 900) -> Ran:
    """`evotrainer ARGS` in a subprocess, to its end; it must exit with `code`."""
    p = start_cli(*args, cwd=cwd, text=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # its workers too
        p.communicate()
        raise
    assert p.returncode == code, err[-3000:]
    return Ran(out, err)


# ---------------------------------------------------------------------------- agents


def agent_context(findings=(), knobs=None, tried=(), tmp_path: Path | None = None, **kw):
    """What an agent is shown, over the reference knobs at target level 3. With `tmp_path`, the
    parent's files (a copy of the reference, for agents that read code) and a workdir are there."""
    ref = load_knobs(REFERENCE / "knobs.yaml")
    if tmp_path is not None:
        kw |= {"harness_dir": shutil.copytree(REFERENCE, tmp_path / "parent"), "workdir": tmp_path / "agents"}
    return AgentContext(findings=list(findings), knobs=knobs or ref, root_knobs=ref, target_level=3,
                        tried=frozenset(tried), **kw)


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether `ancestor` is a parent, grandparent, ... of `pid` (Linux /proc)."""
    while pid > 1:
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            return False
        if pid == ancestor:
            return True
    return False


# ---------------------------------------------------------------------------- a user's task

# a user's own task module (`file.py:Parity`): a task from outside the package
PARITY_TASK = '''
from evotrainer.tasks import Task, Problem


class Parity(Task):
    """Is n even? n has `level` digits (level 3: 900 problems, a pool of about 225)."""
    name, levels, max_new_tokens = "parity", (1, 2, 3), 5

    def __init__(self, level=None):
        self.target_level = level or 3

    def problem_space(self, level):
        return 9 * 10 ** (level - 1)

    def generate(self, rng, level):
        n = rng.randrange(10 ** (level - 1), 10 ** level)
        return Problem(id=str(n), prompt=f"{n} even?", answer="yes" if n % 2 == 0 else "no", level=level)

    def score(self, problem, completion):
        return float(completion.strip() == problem.answer)
'''

"""Run untrusted model-written programs: a whole batch in one sandboxed process.

    outcomes = run_programs([Program(code, "add", cases=((1, 2),), expected=(3,))])

The caller starts one *driver* per call through `command()` (launch.py: namespaces, no
network, a read-only filesystem, nobody, an empty environment) and sends it the batch on
stdin: code, entry names and case arguments, never the expected values, which stay here,
outside the sandbox, where the outputs are compared. The driver makes itself non-dumpable
(a program running as the same user cannot read its memory or its fds through /proc) and a
child subreaper, then runs the programs one at a time, each in a fork of its own (~1 ms,
against ~20 ms for a fresh interpreter: a training step judges hundreds of programs) under
its own limits: address space `memory_mb`, CPU time about `timeout_s`, small files, few
processes, and a wall-clock deadline past which its process group is killed. A fork holds
what the driver holds, the batch's code and arguments, nothing secret. After each program
the driver kills and reaps whatever it left behind (daemons included: as subreaper, or as
PID 1 of the sandbox's PID namespace, the driver inherits every orphan), so no program runs
beside another: a program cannot stop, kill or read a neighbour. One program at a time on
purpose: all run as one user, and a program beside another could kill it to raise its own
share of a GRPO group's reward. The driver's report comes back as one JSON object on stdout,
checked here; anything malformed makes every outcome a runtime_error, never a crash.
The driver, and every program, works in the batch's own scratch directory (removed
afterwards), never in the caller's.

Outputs are compared with strict equality after a JSON round trip of both (same JSON type
at every level: True is not 1, 2.0 is not 2; an object with its own __eq__ is not JSON and
fails). Results travel on a pipe of their own; fds 0, 1 and 2, sys.stdout and stdin point
to /dev/null before the program runs, so print() cannot corrupt them.

What a hostile program can still do, in its own process: forge its own result lines. In
cases mode that gains nothing without the expected values, which never enter the sandbox.
In check mode (HumanEval style) the test code runs in the program's process, so a hostile
program can fake a pass (patch builtins, write a "passed" line on the result fd and exit):
check mode measures honest programs, it is no defence against reward hacking. A program can
also kill the driver (same user): its whole batch then fails, its own result with it.

Status of a program, from the first case (in order) that did not pass:
    passed         every case passed (check mode: check(entry) returned)
    failed         a case returned a wrong value (or one that is not JSON data); in check
                   mode, an assert of the test code itself failed
    runtime_error  a case raised, the code raised while loading, or the process died
    memory         a case (or loading) raised MemoryError: the address-space limit
    timeout        the program ran past its wall-clock or CPU limit, or never ran because
                   the batch's deadline passed
    syntax_error   the code does not compile
`passed` counts every case that passed, before or after the first failure.

This file is also the driver (`python -I -S programs.py`): standard library only at import.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from evotrainer.sandbox.launch import Isolation

STATUSES = ("passed", "failed", "syntax_error", "runtime_error", "timeout", "memory")
RESULT_CAP = 8 * 2**20   # bytes of result lines one program may send (past it: killed, runtime_error)
FILE_MB = 4              # largest file a program may write (in the sandbox, only its private /tmp)
PROCESSES = 64           # RLIMIT_NPROC of a program (counted over its batch's own user: it cannot fork-bomb)
OPEN_FILES = 256
ERROR_CHARS = 300
DRIVER_SLACK_S = 10.0    # the caller's deadline past the programs' own: sandbox start, reporting
PER_DRIVER = 32          # a batch gets another driver (another core) per this many programs
_NAMESPACES = "namespaces"  # Isolation.NAMESPACES (this file imports nothing of ours at import time)
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 1, 4, 36


@dataclass(frozen=True)
class Program:
    code: str                          # the program source (e.g. prompt prefix + model completion)
    entry: str                         # name of the function under test
    cases: tuple[tuple, ...] = ()      # argument tuples (JSON-able); the program's process gets only these
    expected: tuple = ()               # expected return value per case; compared here, never sent
    check: str | None = None           # HumanEval style: test code defining check(candidate)

    def __post_init__(self) -> None:
        if self.check is not None and (self.cases or self.expected):
            raise ValueError("a Program has either check code or cases with expected values, not both")
        if self.check is None and (not self.cases or len(self.cases) != len(self.expected)):
            raise ValueError(f"a Program needs check code, or cases with one expected value each "
                             f"(got {len(self.cases)} cases, {len(self.expected)} expected)")

    @property
    def total(self) -> int:
        return 1 if self.check is not None else len(self.cases)


@dataclass(frozen=True)
class Outcome:
    status: str     # one of STATUSES
    passed: int     # cases passed (check mode: 0 or 1)
    total: int
    error: str = ""  # the first failure, one short line

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0

    @property
    def failure(self) -> str | None:
        """What went wrong, in a word the diagnostics can count: None (passed), 'wrong output',
        'timeout', 'MemoryError', 'SyntaxError', or the type of the exception raised."""
        fixed = {"passed": None, "failed": "wrong output", "timeout": "timeout", "memory": "MemoryError"}
        if self.status in fixed:
            return fixed[self.status]
        # "f(3) raised ZeroDivisionError: ...", "NameError: ...", "SyntaxError: ..."
        m = re.search(r"raised (\w+)", self.error) or re.match(r"(\w+(?:Error|Exception|Exit|Interrupt))\b", self.error)
        return m.group(1) if m else self.status


def run_programs(programs: list[Program], *, timeout_s: float = 2.0, memory_mb: int = 512,
                 level: Isolation | None = None, hide: tuple[str, ...] = (),
                 drivers: int | None = None) -> list[Outcome]:
    """Run every program (each with `timeout_s` and `memory_mb` of its own) in sandboxed
    drivers at `level` (None: the process-wide level, processes.isolation()); one
    Outcome per program, in order.

    `hide`: files the programs must not read although the caller may, a task's data files
    (its expected values or reference solutions, perhaps in the package the sandbox reads).
    `drivers`: how many sandboxes share a large batch, side by side (None: one per core, at
    most 4, and one per PER_DRIVER programs). Programs in different sandboxes cannot see or
    signal each other (each has its own PID namespace), so this keeps one-at-a-time within
    a sandbox and still uses every core: judging is half of a codegen step on one."""
    if not programs:
        return []
    if level is None:
        from evotrainer.sandbox.processes import isolation
        level = isolation()
    if drivers is None:
        from evotrainer.sandbox.processes import usable_cores
        drivers = min(usable_cores(), 4, max(len(programs) // PER_DRIVER, 1))
    if level == _NAMESPACES and drivers > 1:  # (without namespaces, drivers would share one PID space)
        from concurrent.futures import ThreadPoolExecutor
        parts = [programs[i::drivers] for i in range(drivers)]
        with ThreadPoolExecutor(drivers) as pool:
            done = list(pool.map(lambda part: _run_batch(part, timeout_s, memory_mb, level, hide), parts))
        out: list[Outcome] = [None] * len(programs)  # type: ignore[list-item]
        for i, part in enumerate(done):
            out[i::drivers] = part
        return out
    return _run_batch(programs, timeout_s, memory_mb, level, hide)


def _run_batch(programs: list[Program], timeout_s: float, memory_mb: int, level: Isolation,
               hide: tuple[str, ...]) -> list[Outcome]:
    """One sandboxed driver for `programs`, one at a time inside it."""
    # imported here: this file also runs as the driver, without our package on its path
    from evotrainer.sandbox import users
    from evotrainer.sandbox.launch import Isolation, Jail, Limits, command, job_env
    budget = len(programs) * timeout_s + DRIVER_SLACK_S / 2  # the driver stops starting programs past it
    deadline = len(programs) * timeout_s + DRIVER_SLACK_S
    batch = {"timeout_s": timeout_s, "memory_mb": memory_mb, "budget_s": budget,
             "programs": [{"code": p.code, "entry": p.entry, "cases": list(p.cases), "check": p.check}
                          for p in programs]}
    try:
        data = json.dumps(batch).encode()
        json.dumps([p.expected for p in programs])
    except (TypeError, ValueError) as e:
        raise ValueError(f"program cases and expected values must be JSON data: {e}") from None
    job_dir = Path(tempfile.mkdtemp(prefix="evotrainer-programs-"))  # its spec: ours, out of its reach
    user = users.lease() if level is Isolation.NAMESPACES and os.geteuid() == 0 else None  # a uid of its own
    try:
        argv, env = command([sys.executable, "-I", "-S", str(Path(__file__).resolve())],
                            Jail(limits=Limits(tmp_mb=64), hide=tuple(hide), user=None if user is None else user.uid),
                            level, job_dir=job_dir, cwd=job_dir, timeout_s=deadline)
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                cwd=job_dir, env=env if env is not None else job_env(), start_new_session=True)
        try:
            out, err = proc.communicate(data, timeout=deadline)
        except BaseException as e:  # past the deadline, or interrupted: the driver never outlives us
            from evotrainer.sandbox.processes import kill_tree
            kill_tree(proc)
            proc.communicate()
            if not isinstance(e, subprocess.TimeoutExpired):
                raise
            return [Outcome("timeout", 0, p.total, f"the batch ran past its deadline of {deadline:.0f} s")
                    for p in programs]
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)
        if user is not None:
            user.release()
    try:
        return _parse(out, programs, timeout_s)
    except (ValueError, TypeError, KeyError) as e:
        last = (err.decode("utf-8", "replace").strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        why = f"program driver failed ({e}): {last}"[:ERROR_CHARS]
        return [Outcome("runtime_error", 0, p.total, why) for p in programs]


def _parse(out: bytes, programs: list[Program], timeout_s: float) -> list[Outcome]:
    """The driver's reports, checked (ValueError on anything unexpected), judged here."""
    rows = json.loads(out)["reports"]
    if not isinstance(rows, list) or len(rows) != len(programs):
        raise ValueError(f"expected {len(programs)} reports")
    outcomes = []
    for row, p in zip(rows, programs):
        text, stop = row["lines"], row["stop"]
        if not isinstance(text, str) or not isinstance(stop, str):
            raise ValueError(f"malformed report {str(row)[:80]}")
        try:
            lines = [json.loads(raw) for raw in text.splitlines()]
            if not all(isinstance(line, dict) for line in lines):
                raise ValueError("not a JSON object")
            outcomes.append(Outcome(*_judge(p, lines, stop, timeout_s)))
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):  # lines the program wrote itself
            outcomes.append(Outcome("runtime_error", 0, p.total, "the program broke the result protocol "
                                                                 "(wrote to its result pipe)"))
    return outcomes


# ---------------------------------------------------------------------------------------
# The program's process: a fork of the driver, limited, its stdio on /dev/null. One JSON
# line per step on its result pipe: {"syntax_error"} | {"load_error", "memory"} | {"loaded"},
# then per case {"ok": json text} | {"raised", "memory", "wrong"} | {"bad_output"}.

def _why(e: BaseException, check: str | None) -> str:
    """One line: 'Type: message', with the test line a check failed on."""
    try:
        text = str(e)
    except BaseException:
        text = "(unprintable)"
    msg = f"{type(e).__name__}: {text}" if text else type(e).__name__
    tb, line = e.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<check>":
            line = tb.tb_lineno
        tb = tb.tb_next
    if line and check:
        lines = check.splitlines()
        if 0 < line <= len(lines):
            msg += f" (check line {line}: {lines[line - 1].strip()})"
    return " ".join(msg.split())[:ERROR_CHARS]


def _program(job: dict, report) -> None:
    """Run one program's job in this (forked, limited) process, reporting on `report`."""
    import types

    def send(**line) -> None:
        report.write(json.dumps(line) + "\n")
        report.flush()

    check = job["check"]
    try:
        code = compile(job["code"], "<program>", "exec")
    except BaseException as e:
        return send(syntax_error=_why(e, check))
    program = types.ModuleType("program")  # a real module: dataclasses and pickling find it
    sys.modules["program"] = program
    space = program.__dict__
    try:
        exec(code, space)
        if check is not None:
            exec(compile(check, "<check>", "exec"), space)
        if not callable(space.get(job["entry"])):
            raise NameError(f"the program defines no function '{job['entry']}'")
    except BaseException as e:
        return send(load_error=_why(e, check), memory=isinstance(e, MemoryError))
    send(loaded=True)
    fn = space[job["entry"]]
    if check is not None:
        try:
            space["check"](fn)
        except BaseException as e:
            tb = e.__traceback__
            while tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            # a failed assert of the test code itself is a wrong answer, not a crash of the program
            wrong = isinstance(e, AssertionError) and tb is not None and tb.tb_frame.f_code.co_filename == "<check>"
            send(raised=_why(e, check), memory=isinstance(e, MemoryError), wrong=wrong)
        else:
            send(ok="null")
    for args in job["cases"]:
        try:
            got = fn(*args)
        except BaseException as e:
            send(raised=_why(e, check), memory=isinstance(e, MemoryError))
            continue
        try:
            send(ok=json.dumps(got))
        except BaseException:
            send(bad_output=f"a {type(got).__name__}, not JSON data")


def _child(job: dict, w: int, timeout_s: float, memory_mb: int) -> None:
    """The forked side: its own process group, limits, stdio on /dev/null, then the program;
    never returns (os._exit: no atexit handler or finalizer of the program's runs)."""
    try:
        os.setpgid(0, 0)
        mb, cpu = 2**20, int(timeout_s) + 1
        limits = {resource.RLIMIT_AS: (memory_mb * mb,) * 2,
                  resource.RLIMIT_CPU: (cpu, cpu + 1),  # SIGXCPU at the soft limit, SIGKILL a second later
                  resource.RLIMIT_FSIZE: (FILE_MB * mb,) * 2, resource.RLIMIT_NPROC: (PROCESSES,) * 2,
                  resource.RLIMIT_NOFILE: (OPEN_FILES,) * 2, resource.RLIMIT_CORE: (0, 0)}
        for res, (soft, hard) in limits.items():
            top = resource.getrlimit(res)[1]  # never above what the driver itself may have
            if top != resource.RLIM_INFINITY:
                soft, hard = min(soft, top), min(hard, top)
            resource.setrlimit(res, (soft, hard))
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, w)  # the driver's other descriptors (its stdin and stdout are 0 and 1: gone)
        os.closerange(w + 1, OPEN_FILES)
        sys.stdin, sys.stdout, sys.stderr = open(os.devnull), open(os.devnull, "w"), open(os.devnull, "w")
        _program(job, os.fdopen(w, "w"))
    finally:
        os._exit(0)


def _prctl(option: int, value: int) -> None:
    """Best effort: Linux only."""
    try:
        ctypes.CDLL(None).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _drive() -> None:
    _prctl(PR_SET_DUMPABLE, 0)         # no program reads our memory or our stdout through /proc
    _prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans (setsid daemons) become ours to kill
    batch = json.loads(sys.stdin.buffer.read())
    end = time.monotonic() + batch["budget_s"]
    reports = []
    for p in batch["programs"]:
        try:
            reports.append(_run_one(p, batch["timeout_s"], batch["memory_mb"], end))
        except Exception as e:  # a bug of ours on one program fails that program, not the batch
            reports.append({"lines": "", "stop": f"hit a driver error: {type(e).__name__}: {e}"[:ERROR_CHARS]})
        _kill_strays()
    sys.stdout.write(json.dumps({"reports": reports}))
    sys.stdout.flush()


def _total(p: dict) -> int:
    return 1 if p["check"] is not None else len(p["cases"])


def _run_one(p: dict, timeout_s: float, memory_mb: int, end: float) -> dict:
    """One program in a fork: {"lines": what it reported, "stop": why it stopped}."""
    if time.monotonic() >= end:
        return {"lines": "", "stop": "timeout"}
    r, w = os.pipe()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _child(p, w, timeout_s, memory_mb)
    os.close(w)
    try:
        os.setpgid(pid, pid)  # (the child does too: whichever runs first)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        out, stop = _read(pid, r, min(time.monotonic() + timeout_s, end), 1 + _total(p))
    finally:
        os.close(r)
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        _, status = os.waitpid(pid, 0)
    return {"lines": out.decode("utf-8", "replace"), "stop": stop or _ending(os.waitstatus_to_exitcode(status))}


def _ending(code: int) -> str:
    """How a child that stopped reporting ended: 'timeout' (CPU limit) or a phrase."""
    if code == -signal.SIGXCPU:
        return "timeout"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _read(pid: int, fd: int, deadline: float, want: int) -> tuple[bytes, str | None]:
    """The child's report lines, until it is done: (bytes, None) when it exited or sent all
    `want` lines, else (bytes, 'timeout' | 'too much output'). A daemon it left may hold the
    pipe open, so exit is polled rather than waited for as EOF."""
    buf = bytearray()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return bytes(buf), "timeout"
        if select.select([fd], [], [], min(left, 0.05))[0]:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return bytes(buf), None
            buf += chunk
            if len(buf) > RESULT_CAP:
                return bytes(buf), "too much output"
            if buf.count(b"\n") >= want:
                return bytes(buf), None
        elif os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:  # exited (not reaped)
            while select.select([fd], [], [], 0)[0] and (chunk := os.read(fd, 1 << 16)):
                buf += chunk
                if len(buf) > RESULT_CAP:
                    return bytes(buf), "too much output"
            return bytes(buf), None


def _judge(p: Program, lines: list[dict], stop: str, timeout_s: float) -> list:
    """[status, passed, total, error] from the report lines; `stop`: why they may end early."""
    total, entry = p.total, p.entry
    if stop == "timeout":
        unfinished = ("timeout", f"ran past the time limit of {timeout_s:g} s")
    elif stop == "too much output":
        unfinished = ("runtime_error", f"sent more than {RESULT_CAP // 2**20} MB of results")
    else:
        unfinished = ("runtime_error", f"did not finish: its process {stop}")
    if not lines:
        return [unfinished[0], 0, total, f"the program {unfinished[1]}"]
    first = lines[0]
    if "syntax_error" in first:
        return ["syntax_error", 0, total, str(first["syntax_error"])[:ERROR_CHARS]]
    if "load_error" in first:
        return ["memory" if first.get("memory") else "runtime_error", 0, total, str(first["load_error"])[:ERROR_CHARS]]
    passed, failure = 0, None
    for i in range(total):
        line = lines[1 + i] if 1 + i < len(lines) else None
        call = "check(candidate)" if p.check is not None else f"{entry}{_args(p.cases[i])}"
        if line is None:
            fail = (unfinished[0], f"{call} {unfinished[1]}")
        elif "ok" in line:
            if p.check is not None or _same(json.loads(line["ok"]), json.loads(json.dumps(p.expected[i]))):
                passed += 1
                continue
            fail = ("failed", f"{call} returned {_short(json.loads(line['ok']))}, expected {_short(p.expected[i])}")
        elif "raised" in line and line.get("wrong"):
            fail = ("failed", f"{call} failed: {line['raised']}")
        elif "raised" in line:
            fail = ("memory" if line.get("memory") else "runtime_error", f"{call} raised {line['raised']}")
        else:
            fail = ("failed", f"{call} returned {line.get('bad_output', 'nothing readable')}")
        failure = failure or fail
    if failure is None:
        return ["passed", passed, total, ""]
    return [failure[0], passed, total, failure[1][:ERROR_CHARS]]


def _same(got, want) -> bool:
    """Strict equality of JSON data: the same type at every level (True is not 1, 2.0 not 2)."""
    if type(got) is not type(want):
        return False
    if isinstance(got, list):
        return len(got) == len(want) and all(map(_same, got, want))
    if isinstance(got, dict):
        return got.keys() == want.keys() and all(_same(got[k], want[k]) for k in got)
    return got == want


def _short(value, chars: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= chars else text[:chars - 3] + "..."


def _args(args: list) -> str:
    return "(" + ", ".join(_short(a, 40) for a in args) + ")"


def _descendants(pid: int) -> list[int]:
    """Every live descendant of pid (by each process's parent in /proc/*/stat; Linux only)."""
    parent: dict[int, int] = {}
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    parent[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def _kill_strays() -> None:
    """Kill and reap everything the last program left behind. Orphans come to the driver (as
    subreaper, or as PID 1 of the sandbox), and it runs nothing between programs: any child
    it has now is a stray, and with no child at all nothing is left (the common case: one
    system call)."""
    for _ in range(200):  # a fork loop is bounded by RLIMIT_NPROC; each round kills what it sees
        try:
            while os.waitpid(-1, os.WNOHANG)[0] != 0:
                pass  # reaped one that had died
        except ChildProcessError:
            return
        for pid in _descendants(os.getpid()):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.005)


if __name__ == "__main__":
    _drive()

"""Functions the worker tests run in a child process (imported there by name)."""
import os
import subprocess
import sys
import time


def add(a, b):
    return a + b


def boom():
    raise ValueError("the harness broke")


def spin_with_child(marker):
    # a grandchild in the same process group: the timeout must kill it too
    subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(600)  # {marker}-child"])
    while True:
        time.sleep(0.05)


def hog():
    blocks = []
    while True:
        blocks.append(bytearray(50 * 1024 * 1024))


def hard_exit():
    os._exit(7)


def interval(seconds):
    """(start, end) of a short sleep, so a test can see whether two workers overlapped."""
    t0 = time.time()
    time.sleep(seconds)
    return t0, time.time()


def torch_threads():
    import torch
    return torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")


def sleep_forever():
    while True:
        time.sleep(0.05)


# Hostile jobs for the sandbox tests: each tries what untrusted code must not do, and
# reports what happened (the sandbox's tests check the outside world as well).

def try_connect(port, host="127.0.0.1"):
    import socket
    try:
        socket.create_connection((host, port), timeout=2).close()
        return "connected"
    except OSError as e:
        return f"refused: {e}"


def own_loopback():
    """Listen on this namespace's 127.0.0.1 and connect to it (what data-parallel ranks do)."""
    import socket
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        return try_connect(server.getsockname()[1])


def read_env(name):
    return os.environ.get(name)


def try_write(path):
    try:
        with open(path, "w") as f:
            f.write("written by a sandboxed job")
        return "written"
    except OSError as e:
        return f"refused: {e}"


def escape_with_setsid(marker):
    """A daemon: double fork and setsid, then sleep forever under a name the test can find."""
    subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(600)  # {marker}"],
                     start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    return "started"


def allocate(gb):
    blob = bytearray(int(gb * 2**30))
    return len(blob)


def whoami():
    import socket
    return {"uid": os.getuid(), "pid": os.getpid(), "env": sorted(os.environ), "hostname": socket.gethostname(),
            "home": sorted(os.listdir(os.path.expanduser("~")))}


def not_json():
    return {"a callable": print}


def daemon_then_sleep(marker):
    """A training job that left a daemon behind, still running when its controller dies."""
    escape_with_setsid(marker + "-daemon")
    sleep_forever()


def list_run():
    """What /run holds (named here: a path in a job's arguments is one it may read)."""
    return sorted(os.listdir("/run"))


def read_tree(root):
    """Every file under root with its content (what a job can see there)."""
    from pathlib import Path
    return {str(p.relative_to(root)): p.read_text() for p in sorted(Path(root).rglob("*")) if p.is_file()}


def note_then_sleep(out, seconds, marker):
    """Append a line to out/starts (one per attempt), leave a child under `marker`, then sleep:
    a job a test can kill midway and then look for what it left running."""
    with open(os.path.join(out, "starts"), "a") as f:
        f.write(f"{time.time()}\n")
    subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(600)  # {marker}"])
    time.sleep(seconds)
    with open(os.path.join(out, "starts")) as f:
        return len(f.read().split())


def probe(paths):
    """What a job can do with each path: its listing or first bytes, or why not (a test of
    what a sandboxed job sees); and its job directory (which worker ran it)."""
    out = {}
    for p in paths:
        try:
            out[p] = ("listed: " + ",".join(sorted(os.listdir(p)))) if os.path.isdir(p) else "read: " + open(p).read(100)
        except OSError as e:
            out[p] = f"refused: {type(e).__name__}"
    return out | {"job": sys.argv[1]}


def harness_ready():
    """The moment harness code runs in a job: torch and the reference harness loaded (what a
    training job needs before its first slot call), on the machine's wall clock."""
    import torch  # noqa: F401
    from evotrainer.harness import REFERENCE, load_harness
    load_harness(REFERENCE)
    return time.time()


def identity():
    """What a job is, beyond whoami: its capabilities and privileges (/proc/self/status),
    whether torch was imported before the job began (a fork of the server) and what its open
    descriptors lead to."""
    status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass  # the listing's own
    return {"preloaded": "torch" in sys.modules, "fds": fds,
            **{k: status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp")}}


# Jobs that attack what the controller reads of them (test_sandbox.py): each ends with
# os._exit(0), so that the worker writes no result of its own over what the job left.

def plant_result(kind, target=None):
    """Leave out/result.json as a link to `target`, a fifo, or a file past the result cap."""
    path = os.path.join(sys.argv[1], "out", "result.json")
    if kind == "link":
        os.symlink(target, path)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        with open(path, "wb") as f:
            f.write(b'{"label": "ok", "value": "')
            f.truncate(17 * 2**20)
    sys.stdout.flush()
    os._exit(0)


def rewrite_spec():
    """Try to rewrite the job's spec files (sandbox.json, job.json): what happened to each."""
    out = {}
    for name in ("sandbox.json", "job.json"):
        path = os.path.join(sys.argv[1], name)
        try:
            with open(path, "w") as f:
                f.write('{"argv": ["/bin/sh"]}')
            out[name] = "written"
        except OSError as e:
            out[name] = f"refused: {type(e).__name__}"
    return out


def fork_to_limit(out, until):
    """Fork until the process limit refuses, say so in `out`/full, and hold them until the
    file `until` exists (a minute at most): how many it started."""
    children = 0
    while True:
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(120)  # killed with the job
            os._exit(0)
        children += 1
    with open(os.path.join(out, "full"), "w") as f:
        f.write(str(children))
    deadline = time.time() + 60
    while not os.path.exists(until) and time.time() < deadline:
        time.sleep(0.05)
    return children


def start_processes(n, after, out):
    """Once the file `after` exists, start n processes one at a time (each exits at once),
    then write `out`/done: how many started."""
    deadline = time.time() + 60
    while not os.path.exists(after) and time.time() < deadline:
        time.sleep(0.05)
    started = 0
    for _ in range(n):
        try:
            pid = os.fork()
        except OSError as e:
            started = f"refused after {started}: {e}"
            break
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        started += 1
    with open(os.path.join(out, "done"), "w") as f:
        f.write(str(started))
    return started


def fill_shm(mb):
    """Write `mb` MB to /dev/shm (memory: a tmpfs), then hold it."""
    with open("/dev/shm/fill", "wb") as f:
        for _ in range(mb):
            f.write(b"\1" * 2**20)
    sleep_forever()


def train_rows(spec, others=()):
    """How many training problems the task `spec` has here, and what the job sees of `others`."""
    from evotrainer.catalog import get_task
    task = get_task(spec)
    return {"rows": task.problem_space(task.target_level), "others": {p: os.path.exists(p) for p in others}}

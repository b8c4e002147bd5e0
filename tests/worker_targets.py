"""Functions the worker tests run in a child process (imported there by name)."""
import os
import subprocess
import sys
import time


def add(a, b):
    return a + b


def boom():
    raise ValueError("the harness broke")


def spin_with_child(pid_file):
    # a grandchild in the same process group: the timeout must kill it too
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(pid_file, "w") as f:
        f.write(str(child.pid))
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


def my_pid():
    return os.getpid()

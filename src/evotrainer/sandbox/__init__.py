"""One sandbox for every untrusted execution (launch.py says what it isolates, inside.py how)."""
from evotrainer.sandbox.launch import (CHOICES, Isolation, Jail, Limits, command, conceal,
                                       concealed, describe, job_env, paths_in, prepare, probe, record, resolve,
                                       view, why_not)

__all__ = ["CHOICES", "Isolation", "Jail", "Limits", "command", "conceal", "concealed", "describe",
           "job_env", "paths_in", "prepare", "probe", "record", "resolve", "view", "why_not"]

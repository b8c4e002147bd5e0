"""One sandbox for every untrusted execution (launch.py says what it isolates, inside.py how)."""
from evotrainer.sandbox.launch import (CHOICES, Isolation, Jail, Limits, command, conceal, concealed, declared_paths,
                                       describe, job_env, named_paths, prepare, probe, record, resolve, root_contents,
                                       why_not)

__all__ = ["CHOICES", "Isolation", "Jail", "Limits", "command", "conceal", "concealed", "declared_paths", "describe",
           "job_env", "named_paths", "prepare", "probe", "record", "resolve", "root_contents", "why_not"]

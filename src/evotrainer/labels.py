"""Trial labels: how a trial ended, one word in the lineage, and the groups the search reads.

Every finished trial carries exactly one label. The members are `str`s, so the lineage's
SQLite rows and JSON events hold the plain words, and a label read back from disk (a plain
string) is found in the groups below as a member would be. The training worker's own
outcome (ok / crash / timeout / oom, executors/worker.py) is another thing: a failed
worker's word becomes the trial's label.
"""
from __future__ import annotations

import enum
from typing import Iterable


class Label(enum.StrEnum):
    KEPT = "kept"                                 # trained and beat its control: a state later trials branch from
    DISCARDED = "discarded"                       # did not beat its control (or its change changed nothing)
    INVALID = "invalid"                           # a blocking finding (reward gamed): never kept, however it scored
    ILLEGAL = "illegal"                           # breaks a legality rule, or this run's backend cannot train it
    BACKTEST_REJECTED = "backtest_rejected"       # rescored on the parent's rollouts, it failed before training
    EQUIVALENT = "equivalent"                     # would train like a sibling already tried: not trained
    CRASH = "crash"                               # a training worker raised or died
    TIMEOUT = "timeout"                           # a training worker ran past the trial's time limit
    OOM = "oom"                                   # a training worker ran out of memory
    BAD_OUTPUT = "bad_output"                     # what a job wrote was refused (a link, a malformed record,
                                                  # checkpoints off the run's schedule, weights the base cannot take)
    UNPARSEABLE = "unparseable"                   # the agent's reply could not be read as a proposal
    PATCH_FAILED = "patch_failed"                 # the agent's edits did not apply, or changed no harness file
    SYNTAX_ERROR = "syntax_error"                 # the agent's edited harness code does not parse
    AGENT_TIMEOUT = "agent_timeout"               # the agent ran past its time limit
    AGENT_ERROR = "agent_error"                   # the agent itself failed (a wrong URL, key or model; a bug)
    ABORTED = "aborted"                           # a person ended it at an approval point, or revised it with nothing left
    DIAGNOSTIC_REJECTED = "diagnostic_rejected"   # a new diagnostic that does not separate failed from held-up


# the agent produced nothing usable: nothing was committed or trained
AGENT_FAILED = frozenset({Label.UNPARSEABLE, Label.PATCH_FAILED, Label.SYNTAX_ERROR, Label.AGENT_TIMEOUT,
                          Label.AGENT_ERROR})
# a training worker did not finish, or what it wrote was refused: the change was never judged on its merits
CRASHED = frozenset({Label.CRASH, Label.TIMEOUT, Label.OOM, Label.BAD_OUTPUT})
# a non-root trial that did not give a state to build on: a streak of these escalates the
# search (EQUIVALENT is neither a success nor a failure: it is passed over)
FAILED = frozenset({Label.DISCARDED, Label.INVALID, Label.ILLEGAL, Label.BACKTEST_REJECTED, *CRASHED, *AGENT_FAILED,
                    Label.ABORTED, Label.DIAGNOSTIC_REJECTED})

# a version that held up: kept. A diagnostic replay's positive side, and what counts as a
# skill having held on a task
HELD_UP = frozenset({Label.KEPT})
# versions that trained (or tried to) and fell short: what a diagnostic replay must separate
# from those that held up. Never-trained labels have no evidence of their own to replay
FELL_SHORT = frozenset({Label.DISCARDED, Label.INVALID, *CRASHED})
# every outcome label a diagnostic replay accepts
REPLAYABLE = HELD_UP | FELL_SHORT


def in_order(labels: Iterable[str]) -> list[Label]:
    """The given labels in the enum's order (frozensets have none): for messages that list them."""
    wanted = set(labels)
    return [label for label in Label if label in wanted]

"""How often the backtest's verdicts were borne out by training, as measured on the landscape
tables (bench/landscape.py --calibrate writes measured.json from every table's records): each
move trained from the root on a pool of seeds, beside its backtest on the root's rollouts. A
verdict is printed with these counts, so a reader weighs it by what it has predicted so far.

A move "gained" where its mean validation gain over the root, paired by seed, is above zero.
Only judged moves count: a move the backtest cannot see (an optimiser or sampling knob) passes
unjudged and predicts nothing.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

MEASURED = Path(__file__).with_name("measured.json")


@dataclass(frozen=True)
class Agreement:
    """One table's judged moves, counted by verdict and by what training showed."""
    judged: int = 0
    gained: int = 0           # of the judged, how many gained when trained
    passed: int = 0
    passed_gained: int = 0
    rejected_lost: int = 0    # rejected, and did not gain

    @property
    def rejected(self) -> int:
        return self.judged - self.passed

    @property
    def agreed(self) -> int:
        return self.passed_gained + self.rejected_lost

    def __add__(self, other: "Agreement") -> "Agreement":
        return Agreement(*(getattr(self, f) + getattr(other, f) for f in
                           ("judged", "gained", "passed", "passed_gained", "rejected_lost")))


def read(path: Path = MEASURED) -> dict[str, Agreement]:
    """The tables' counts by table name (none where nothing was measured)."""
    if not path.is_file():
        return {}
    return {name: Agreement(**counts) for name, counts in json.loads(path.read_text()).items()}


def write(tables: dict[str, Agreement], path: Path = MEASURED) -> None:
    path.write_text(json.dumps({n: a.__dict__ for n, a in sorted(tables.items())}, indent=1) + "\n")


def verdict_note(label: str, judged: bool = True, tables: dict[str, Agreement] | None = None) -> str:
    """What a verdict has predicted on the tables, in a few words to print beside it."""
    tables = read() if tables is None else tables
    if not judged:
        return "unjudged: it cannot see this change (an optimiser or sampling knob); its pass predicts nothing"
    if not tables:
        return "its agreement with training is not measured"
    a = sum(tables.values(), Agreement())
    base = f"({a.gained} of {a.judged} judged moves gained)"
    if label == "passed":
        return f"on the landscape tables {a.passed_gained} of {a.passed} passes gained when trained {base}"
    if label == "backtest_rejected":
        return f"on the landscape tables {a.rejected_lost} of {a.rejected} rejections did not gain when trained {base}"
    return f"on the landscape tables its verdicts agreed with training on {a.agreed} of {a.judged} judged moves"


def summary(tables: dict[str, Agreement] | None = None) -> str:
    """Where the counts come from, per table."""
    tables = read() if tables is None else tables
    if not tables:
        return "The backtest's agreement with training is not measured."
    per = "; ".join(f"{n}: {a.passed_gained} of {a.passed} passes gained, {a.rejected_lost} of {a.rejected} "
                    f"rejections did not ({a.gained} of {a.judged} moves gained)" for n, a in sorted(tables.items()))
    return (f"Measured on {len(tables)} landscape tables, every judged move trained from the root on a pool of "
            f"seeds beside its backtest on the root's rollouts: {per}.")

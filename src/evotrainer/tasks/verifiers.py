"""Verifiers for tasks whose rows carry a reference answer (JSONL tasks), by name.

Each is `verifier(answer, completion) -> score in [0, 1]`: `answer` is the row's reference
answer, `completion` what the policy wrote. They are fixed per task (named in its spec,
`jsonl:PATH?verifier=NAME`) and never chosen by a harness.
"""
from __future__ import annotations

import math as _math
import re
import threading
from collections.abc import Callable

# A number as people write it: optional sign, digits with optional thousands commas
# (1,234,567), optional decimals and exponent. A sign counts only where it cannot be a binary
# minus: "5-3" holds the numbers 5 and 3, "x = -3" holds -3.
_NUMBER = re.compile(
    r"(?:(?<![\w)\]])[-+])?"
    r"(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)"
    r"(?:[eE][-+]?\d+)?"
)
_INTEGER = re.compile(r"[-+]?\d+")


def exact(answer: str, completion: str) -> float:
    """1.0 if the completion, stripped, is the answer, stripped; else 0.0."""
    return 1.0 if completion.strip() == answer.strip() else 0.0


def numeric(answer: str, completion: str) -> float:
    """1.0 if the LAST number in the completion equals the answer (a number); else 0.0.

    Commas inside numbers are thousands separators ("1,234" is 1234). Integers compare
    exactly; anything else as floats within a tight tolerance (rel 1e-9, abs 1e-12), enough
    for rounding noise like 0.30000000000000004, too tight for a wrong digit. No number in
    the completion, or an answer that is not a number, scores 0.0.
    """
    want, got = _as_number(answer.strip()), last_number(completion)
    if want is None or got is None:
        return 0.0
    if isinstance(want, int) and isinstance(got, int):
        return 1.0 if want == got else 0.0
    return 1.0 if _math.isclose(want, got, rel_tol=1e-9, abs_tol=1e-12) else 0.0


def math(answer: str, completion: str) -> float:
    """1.0 if math-verify finds the completion equivalent to the answer; else 0.0.

    `verify(parse(answer), parse(completion))`: LaTeX or plain expressions, \\boxed{...},
    fractions, decimals ("\\frac{1}{2}" accepts "0.5" and "$\\frac12$"). Any exception from
    math-verify scores 0.0.
    """
    from math_verify import parse, verify  # imported here: it pulls in sympy

    # math-verify bounds its time with signal.alarm, which only works in the main thread;
    # elsewhere it would raise on every call and every completion would score 0, so off the
    # main thread we run it without its timeout instead.
    main = threading.current_thread() is threading.main_thread()
    p_kw, v_kw = ({}, {}) if main else ({"parsing_timeout": None}, {"timeout_seconds": None})
    try:
        return 1.0 if verify(parse(answer, **p_kw), parse(completion, **p_kw), **v_kw) else 0.0
    except Exception:  # noqa: BLE001  (the rule: any failure of math-verify scores 0)
        return 0.0


VERIFIERS: dict[str, Callable[[str, str], float]] = {"exact": exact, "numeric": numeric, "math": math}


def last_number(text: str) -> int | float | None:
    """The last number written in `text` (see `_NUMBER`), or None if there is none."""
    found = None
    for found in _NUMBER.finditer(text):
        pass
    return None if found is None else _as_number(found.group())


def answer_problem(verifier: str, answer: str) -> str | None:
    """Why `answer` can never score under `verifier` (checked when a task loads), or None."""
    if verifier == "numeric" and _as_number(answer.strip()) is None:
        return f"answer {answer!r} is not a number (verifier=numeric)"
    return None


def _as_number(text: str) -> int | float | None:
    """`text` as a number if all of it is one (thousands commas allowed), else None."""
    if not _NUMBER.fullmatch(text):
        return None
    plain = text.replace(",", "")
    return int(plain) if _INTEGER.fullmatch(plain) else float(plain)

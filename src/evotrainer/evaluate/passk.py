"""pass@k: the chance that at least one of k samples solves a problem, estimated without bias
from n >= k samples of which c are correct (Chen et al. 2021, "Evaluating Large Language
Models Trained on Code", section 2.1):

    pass@k = 1 - C(n - c, k) / C(n, k)

computed as the product 1 - prod_{i = n-c+1}^{n} (1 - k / i), which never forms the huge
binomials (n = 200, k = 100 overflows a float as a ratio of factorials). Sampling k and
counting (1 - (1 - c/n)^k) would be biased low for k > 1.
"""
from __future__ import annotations

import math

FULL_CREDIT_TOL = 1e-9  # credit this close to 1 is full credit (float rounding, not a partial score)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with n samples, c of them correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0  # every draw of k samples holds a correct one
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def solved(credits: list[float]) -> int:
    """How many samples solve a problem: those with full credit. pass@k asks whether some
    sample is right, so partial credit counts for nothing (summing credits would make four
    half-right samples two solves, and pass@4 1.0 with none right)."""
    return sum(c >= 1.0 - FULL_CREDIT_TOL for c in credits)


def mean_pass_at_k(counts: list[tuple[int, int]], k: int) -> float:
    """The benchmark's pass@k: the mean over problems of pass_at_k, from (n, c) per problem."""
    if not counts:
        raise ValueError("pass@k of no problems")
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)

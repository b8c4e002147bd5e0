def length_pay(r):
    """Binary score plus half the completion's share of the token budget.

    No ordering violation (a correct answer earns at least 1, a wrong one at most 0.5),
    yet inside all-wrong groups it pays for length alone.
    """
    return r.scores + 0.5 * r.lengths.float() / r.max_new_tokens

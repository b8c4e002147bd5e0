# Rewards composed by the search space (evotrainer/agents/space.py): weighted sums of typed parts.


def mix_score1_lengthm0p1(r):
    """Composed reward: score=1.0 length=-0.1

    A weighted sum of typed parts, written by the search space (agents/space.py).
    """
    import torch
    score = r.scores.float()
    length = r.lengths.float() / max(r.max_new_tokens, 1)
    return 1.0 * score - 0.1 * length

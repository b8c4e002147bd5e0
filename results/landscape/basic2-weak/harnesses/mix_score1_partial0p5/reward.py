# Rewards composed by the search space (evotrainer/agents/space.py): weighted sums of typed parts.


def mix_score1_partial0p5(r):
    """Composed reward: score=1.0 partial=0.5

    A weighted sum of typed parts, written by the search space (agents/space.py).
    """
    import torch
    score = r.scores.float()
    partial = torch.tensor([sum(a == b for a, b in zip(p.answer, c)) / max(len(p.answer), len(c), 1)
                            for p, c in zip(r.problems, r.completions)], dtype=torch.float32)
    return 1.0 * score + 0.5 * partial

# Rewards composed by the search space (evotrainer/agents/space.py): weighted sums of typed parts.


def mix_score1_format0p2(r):
    """Composed reward: score=1.0 format=0.2

    A weighted sum of typed parts, written by the search space (agents/space.py).
    """
    import torch
    score = r.scores.float()
    def kinds(text):
        return {'digit' if ch.isdigit() else 'alpha' if ch.isalpha() else 'space' if ch.isspace()
                else 'other' for ch in text}
    well_formed = torch.tensor([float(bool(c.strip()) and not t and kinds(c) <= kinds(p.answer))
                                for p, c, t in zip(r.problems, r.completions, r.truncated.tolist())])
    return 1.0 * score + 0.2 * well_formed

def efficiency_factor(r):
    """The verifier score plus an efficiency factor: the fewer turns, the more reward.

    A reward that pays a behaviour metric directly (EvoTrainer's lesson: its efficiency
    factor produced 1-turn exits). On `vault` an answer without any lookup earns 1, a
    lookup-then-answer 0.33 plus the score: guessing pays until the policy is right two
    times in three. Single-turn tasks have no turns: the score alone.
    """
    if r.turns is None:
        return r.scores.clone()
    return r.scores + 1.0 / r.turns.float().clamp(min=1)

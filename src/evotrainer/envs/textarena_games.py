"""`textarena:GAME`: a single-player TextArena game (`textarena:GuessTheNumber-v0`,
`textarena:Wordle-v0`, `textarena:TowerOfHanoi-v0`, ...) as a multi-turn task.

TextArena (`pip install 'evotrainer[textarena]'`) plays a game as text: `reset(num_players=1,
seed)`, then per turn the player's observation and `step(action)` until the game is done, and
`close()` gives each player's reward. Here a problem is a seed (the game deals itself from it;
the held-out pool is the public hash of the seed), the policy's turn is the action as written
(the game reads its own format, `[5]` for a guess: no tool parsing), and the environment's
answer each turn is what the observation gained since the last one (TextArena's default
wrappers repeat the whole history every turn; the trainer keeps the history itself). The
score is the game's reward for player 0, in [0, 1] (single-player games give 1 for a win and
partial credit for some losses); a game that ends on an invalid move ends `invalid_action`.
A cap cuts a game that is still going: score 0. Caps and evaluation size: `?max_turns=N`
(default 12), `?turn_tokens=N` (256), `?split_size=N` (100 held-out seeds each for validation
and test).

Multi-player games need an opponent the adapter does not provide; they are refused with one
line. TextArena's code runs where episodes are played (training and evaluation jobs, in the
sandbox); the controller only checks that the game is registered and deals for one player.
"""
from __future__ import annotations

from evotrainer.envs.base import FAIL, INVALID, SUCCESS, Caps, EnvTask, Environment, Parser, Step
from evotrainer.envs.foreign import EPISODE_KEYS, SEEDS, episode_options, seeded_problem
from evotrainer.errors import UsageError, unknown
from evotrainer.tasks.base import Problem
from evotrainer.tasks.registry import Family, Resolved, register_family
from evotrainer.tasks.spec import GENERIC_KEYS, Spec

PREFIX = "textarena"
KEYS = EPISODE_KEYS


def _textarena():
    try:
        import textarena
    except ImportError:
        raise UsageError("textarena tasks need TextArena: pip install 'evotrainer[textarena]'") from None
    return textarena


class ArenaEnv(Environment):
    """One game of player 0."""

    def __init__(self, game: str, problem: Problem, caps: Caps):
        super().__init__()
        self.env, self.problem, self.caps, self.seen = _textarena().make(env_id=game), problem, caps, ""

    def reset(self, seed: int) -> str:
        self.env.reset(num_players=1, seed=self.problem.entry)
        return self._observe()

    def step(self, action: str) -> Step:
        done, _ = self.env.step(action)
        if done:
            rewards, info = self.env.close()
            score = min(max(float(rewards.get(0, 0.0)), 0.0), 1.0)
            invalid = bool(info.get(0, {}).get("invalid_move"))
            self.trace.failures += invalid
            return Step("", score, True, False, {"stop": INVALID if invalid else SUCCESS if score >= 1 else FAIL})
        return Step(self._observe(), 0.0, False, False, {})

    def _observe(self) -> str:
        _, obs = self.env.get_observation()
        obs = obs if isinstance(obs, str) else "\n".join(str(m[-1]) if isinstance(m, tuple) else str(m) for m in obs)
        new = obs[len(self.seen):] if obs.startswith(self.seen) else obs
        self.seen = obs
        return new.lstrip("\n") + "\n"


class ArenaTask(EnvTask):
    def __init__(self, game: str, caps: Caps, split_size: int):
        self.game, self.name = game, f"{PREFIX}:{game}"
        self.levels, self.target_level = (0,), 0
        self.caps, self.split_size = caps, split_size

    def generate(self, rng, level: int) -> Problem:
        return seeded_problem(rng, self.name)

    def problem_space(self, level: int) -> int:
        return SEEDS

    def environment(self, problem: Problem, parse: Parser) -> ArenaEnv:
        return ArenaEnv(self.game, problem, self.caps)


def resolve(rest: str, s: Spec, level: int | None) -> Resolved:
    s.check_keys(GENERIC_KEYS + KEYS)
    ta = _textarena()
    from textarena.envs.registration import ENV_REGISTRY
    if rest not in ENV_REGISTRY:
        raise unknown("TextArena game", rest, ENV_REGISTRY)
    if not _single_player(ta, rest):
        raise UsageError(f"{rest} is not a single-player game; textarena tasks play single-player games "
                         "(an opponent is not provided)")
    caps, split_size, episode_query = episode_options(s, max_turns=12)
    query: dict[str, object] = {k: s.query[k] for k in GENERIC_KEYS if k in s.query} | episode_query
    return ArenaTask(rest, caps, split_size), f"{PREFIX}:{rest}", query


def _single_player(ta, game: str) -> bool:
    """Whether the game deals for one player (TextArena records no player counts: a game
    refuses a count it does not support when it resets)."""
    try:
        ta.make(env_id=game).reset(num_players=1, seed=0)
        return True
    except Exception:  # an assert or a ValueError, as the game writes it
        return False


register_family(Family(PREFIX, "textarena:GAME[?max_turns=N&turn_tokens=N&split_size=N] (single-player)", resolve))

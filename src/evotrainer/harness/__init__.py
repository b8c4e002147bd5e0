from evotrainer.harness.knobs import Knobs
from evotrainer.harness.load import REFERENCE, Harness, load_harness
from evotrainer.harness.rollouts import Rollouts

__all__ = ["Harness", "Knobs", "REFERENCE", "Rollouts", "load_harness"]

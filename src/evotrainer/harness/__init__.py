from evotrainer.harness.knobs import Knobs
from evotrainer.harness.load import REFERENCE, Harness, inspect_harness, load_harness
from evotrainer.harness.rollouts import Rollouts

__all__ = ["Harness", "Knobs", "REFERENCE", "Rollouts", "inspect_harness", "load_harness"]

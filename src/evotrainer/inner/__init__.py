from evotrainer.inner.grpo import GRPOTrainer, StepMetrics

__all__ = ["GRPOTrainer", "StepMetrics"]

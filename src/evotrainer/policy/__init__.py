from evotrainer.policy.model import build_model, build_tokenizer, load_policy, save_policy

__all__ = ["build_model", "build_tokenizer", "load_policy", "save_policy"]

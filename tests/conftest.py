import pytest

from evotrainer.policy import build_model, build_tokenizer, save_policy


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory):
    """A randomly initialised policy checkpoint: enough for tests of plumbing, not of learning."""
    path = tmp_path_factory.mktemp("ckpt")
    tok = build_tokenizer()
    save_policy(build_model(len(tok)), tok, path)
    return path

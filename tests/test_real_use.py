"""A user's model, task and backend through `train` and `run`: worker processes and the
evaluator included, from the command line as a user runs it."""
import json

import pytest
import torch
import yaml

from helpers import DIGITS, cli, readable, write_harness

# rewrite=True: the bytes these harnesses always had; a job's sampling seed hashes them, and the
# checks on what two steps of training reach were written against those draws

pytestmark = pytest.mark.slow  # each test trains or runs the loop from the command line


def metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("backend", ["embedded", "trl"])
def test_a_hugging_face_model_trains_with_each_backend_its_reward_rises_and_the_evaluator_scores_it(
        tmp_path, tiny_qwen, backend):
    h = write_harness(tmp_path / "h", {"reward.py": DIGITS}, rewrite=True, reward="digit_share", lr=3e-3,
                      prompts_per_step=8, group_size=8)
    out = tmp_path / "out"
    summary = cli("train", "--task", "arith", "--level", "2", "--model", tiny_qwen, "--harness", h,
                  "--backend", backend, "--steps", 30, "--eval-every", 15, "--out", out).json
    rewards = [m["reward_mean"] for m in metrics(out)]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.15, (first, last)
    assert summary["backend"] == backend and json.loads((out / "run.json").read_text())["backend"] == backend
    # the evaluator scored the base, the step-15 checkpoint and the final one, on held-out problems
    assert [e["step"] for e in json.loads((out / "summary.json").read_text())["evals"]] == [0, 15, 30]
    assert 0 <= summary["val"] <= 1 and 0 <= summary["test"] <= 1
    assert len((out / "evidence.jsonl").read_text().splitlines()) == 30 * 64


def run_config(tmp_path, task, model, level=None, backend="embedded", final_seeds=(100,)):
    root = write_harness(tmp_path / "root", rewrite=True)
    cfg = {"task": task, "model": str(model), "backend": backend, "device": "cpu", "harness": str(root),
           "seeds": [0], "final_seeds": list(final_seeds), "search": {"skills": str(tmp_path / "skills.sqlite")},
           "budget": {"trials": 1, "steps_per_segment": 2, "total_steps": 4, "trial_timeout_s": 300},
           "promotion": {"replicas": 1},  # one replica, the least the gate needs with one seed: plumbing, not gains
           "evaluation": {"every": 1}}
    if level is not None:
        cfg["level"] = level
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def check_run(run, backend="embedded"):
    """The run finished its final comparison, every retraining done by `backend`."""
    final = json.loads((run / "final.json").read_text())
    assert {"val", "test"} <= set(final["comparison"]) and "evolved" in final["table"]
    segments = list(run.glob("final/*/seed-100/segment-*"))
    assert segments and all(json.loads((s / "run.json").read_text())["backend"] == backend for s in segments)
    return final


def test_a_run_completes_with_the_trl_backend(tmp_path, tiny_qwen):
    run = tmp_path / "run"
    cfg = run_config(tmp_path, "arith", tiny_qwen, level=1, backend="trl")
    status = cli("run", cfg, "--out", run, "--json").json
    assert status["trials"] >= 2 and status["backend"] == "trl"  # the root and one proposal, labelled
    assert status["device"] == "cpu, float32" and status["task"] == "arith"
    check_run(run, backend="trl")


USER_TASK = '''
import random

from evotrainer.tasks import Problem, Task


class AnyDigit(Task):
    """Prompts 'say N:'; the verifier gives full credit to any completion holding a digit."""
    name, levels, target_level, max_new_tokens = "any_digit", (1,), 1, 6
    split_size = 64  # held-out problems each for validation and test: a plumbing check, not a score

    def generate(self, rng, level):
        n = rng.randrange(10 ** 6)
        return Problem(id=str(n), prompt=f"say {n}:", answer=str(n % 10), level=level)

    def problem_space(self, level):
        return 10 ** 6

    def score(self, problem, completion):
        return 1.0 if any(c.isdigit() for c in completion) else 0.0
'''


def test_a_task_defined_outside_the_package_goes_through_train_and_run(tmp_path, ckpt):
    here = tmp_path / "project"
    here.mkdir()
    (here / "my_tasks.py").write_text(USER_TASK)
    h = write_harness(tmp_path / "h", rewrite=True)
    out = tmp_path / "train"
    summary = cli("train", "--task", "my_tasks:AnyDigit", "--model", ckpt, "--harness", h, "--steps", 2,
                  "--eval-every", 1, "--out", out, cwd=here).json
    # the user's verifier ran in the training worker and in the evaluator: a random policy writes a digit often
    # (two steps may already make every greedy answer hold one: val 1.0 at some sampling seeds)
    assert summary["task"] == "my_tasks:AnyDigit"
    assert 0 < sum(m["score_mean"] for m in metrics(out)) and 0 < summary["val"] <= 1
    run = tmp_path / "run"  # (the final comparison's retraining is the trl run's to test)
    cfg = run_config(tmp_path, "my_tasks:AnyDigit", ckpt, final_seeds=())
    status = cli("run", cfg, "--out", run, "--json", cwd=here).json
    assert status["state"] == "finished" and status["trials"] == 2 and status["task"] == "my_tasks:AnyDigit"
    assert any(m["score_mean"] > 0 for f in run.glob("**/metrics.jsonl") for m in metrics(f.parent))


def constant_answer_model(path, answer: str):
    """The built-in tiny model, SFT'd to answer `answer` to any prompt: a policy whose score
    depends only on the verifier."""
    from evotrainer.policy import build_model, build_tokenizer, save_policy
    from evotrainer.trainer.pretrain import sft_batch, sft_loss
    from evotrainer.tasks import Problem
    torch.manual_seed(0)
    tok = build_tokenizer()
    model = build_model(len(tok))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(120):
        batch = [Problem(str(i), f"What is {i}/{2 * i}? ", answer, 0) for i in range(1 + step % 7, 33 + step % 7)]
        loss = sft_loss(model, *sft_batch(tok, batch))
        opt.zero_grad()
        loss.backward()
        opt.step()
    save_policy(model, tok, path)
    return path


def test_a_jsonl_math_task_scored_by_math_verify_goes_through_train_and_run(tmp_path):
    """Half the answers are 1/2 in LaTeX: a policy that always writes "1/2" is right on those only
    if the verifier understands mathematics (exact match would score it 0). The file and the run
    directory are named with '=', ':', '?' and ',' (what a spec's syntax uses): the training jobs
    read the train view, the evaluator the file, and the run's root trial is scored."""
    from evotrainer.lineage import LineageStore
    from evotrainer.tasks.spec import canonical
    rows = [{"prompt": f"What is {i}/{2 * i if i % 2 else 3 * i}? ",
             "answer": "\\frac{1}{2}" if i % 2 else "\\frac{1}{3}"} for i in range(1, 400)]
    data = tmp_path / "exp=2,a:b?c" / "fractions.jsonl"
    data.parent.mkdir()
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = canonical(f"jsonl:{data}", {"verifier": "math"})
    model = constant_answer_model(tmp_path / "half", "1/2")
    h = write_harness(tmp_path / "h", rewrite=True)
    readable(tmp_path)
    summary = cli("train", "--task", spec, "--model", model, "--harness", h,
                  "--steps", 2, "--eval-every", 1, "--out", tmp_path / "train").json
    assert 0.3 < summary["base_val"] < 0.7 and 0.3 < summary["val"] < 0.7   # the evaluator: math-verify
    assert sum(m["score_mean"] for m in metrics(tmp_path / "train")) > 0   # the training worker: math-verify too
    from evotrainer.catalog import get_task  # the same rows under exact match: "1/2" is never right
    exact = get_task(canonical(f"jsonl:{data}", {}))
    assert sum(exact.score(p, "1/2") for p in exact.split("val")) == 0
    run = tmp_path / "lr=1e-5,x:y?z"
    cfg = run_config(tmp_path, spec, model, final_seeds=())
    status = cli("run", cfg, "--out", run, "--json").json
    assert status["state"] == "finished" and status["trials"] == 2
    assert 0.3 < status["best"]["val"]["0"] < 0.7  # the root, scored by math-verify in the evaluator
    store = LineageStore(run / "lineage.sqlite")
    root = store.trials()[0]
    store.close()
    assert root.label not in ("crash", "timeout", "oom"), root
    assert (run / "train-data" / "fractions.jsonl").is_file()

"""Data parallelism: 2 processes over gloo take the step 1 process takes (embedded trainer, and TRL under accelerate)."""
import json
import random

import pytest
import torch
import torch.multiprocessing as mp

from helpers import DIGITS, write_harness
from evotrainer.catalog import get_task
from evotrainer.harness import Rollouts, load_harness
from evotrainer.harness.signal import harness_signal
from evotrainer.policy import build_model, build_tokenizer
from evotrainer.policy.generate import select_rows
from evotrainer.trainer.distributed import World, join, leave
from evotrainer.trainer.grpo import GRPOTrainer


def one_update(harness: str, out: str, rank: int, size: int, rendezvous: str) -> None:
    """Sample the step's batch (identical in every process: same seeds), then update on this
    rank's whole groups of it, and save the gradients and weights the step left."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    world = join(rank, size, rendezvous)
    try:
        tok = build_tokenizer()
        h = load_harness(harness)
        tr = GRPOTrainer(build_model(len(tok)), tok, get_task("arith", 1), h, seed=0)
        rows, gen, texts, scores = tr.sample()  # the whole batch, as one process samples it
        tr.world = world
        G = h.knobs.group_size
        sig = harness_signal(h, Rollouts(rows, texts, scores, gen.lengths, gen.truncated, G, tr.T))
        groups = world.shard(len(rows) // G)
        mine = torch.arange(groups.start * G, groups.stop * G)
        tr._update(select_rows(gen, mine), sig.advantages[mine], sig.row_keep[mine])
        torch.save({"grads": [p.grad.clone() for p in tr.params], "weights": [p.detach().clone() for p in tr.params]},
                   f"{out}/rank-{rank}-of-{size}.pt")
    finally:
        leave(world)


def _spawned(rank, harness, out, size, rendezvous):
    one_update(harness, out, rank, size, rendezvous)


def test_a_world_shards_prompts_whole_and_in_order():
    parts = [World(r, 3).shard(8) for r in range(3)]
    assert parts == [slice(0, 3), slice(3, 6), slice(6, 8)]
    assert World().shard(8) == slice(0, 8) and World().gather(5) == [5]


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
def test_two_processes_over_gloo_take_the_step_one_process_takes(tmp_path, agg):
    # a token mean over rows of different lengths: averaging each rank's own token mean (what
    # plain DDP does) would weight a rank's tokens by its share of rows, not of tokens
    h = write_harness(tmp_path / "h", {"reward.py": DIGITS}, prompts_per_step=6, group_size=4, reward="digit_share",
                      loss_agg=agg, group_filter="drop_dead", lr=1e-3)
    one_update(str(h), str(tmp_path), 0, 1, str(tmp_path / "unused"))
    mp.spawn(_spawned, args=(str(h), str(tmp_path), 2, str(tmp_path / "rendezvous")), nprocs=2, join=True)
    single = torch.load(tmp_path / "rank-0-of-1.pt")
    ranks = [torch.load(tmp_path / f"rank-{r}-of-2.pt") for r in range(2)]
    g1 = torch.cat([g.flatten() for g in single["grads"]])
    assert g1.norm() > 0
    for r in ranks:
        g2 = torch.cat([g.flatten() for g in r["grads"]])
        assert (g1 - g2).norm() / g1.norm() < 1e-5
        # Adam's first step is lr x g / (|g| + eps): where |g| is near eps (1e-8) the step is any
        # fraction of lr that float noise in the sum picks (CI saw such weights off by over a
        # twentieth of lr), so the step must agree where the gradient is well above eps, and
        # nowhere may it differ by more than the lr that bounds every first step
        for g, a, b in zip(single["grads"], single["weights"], r["weights"]):
            firm = g.abs() > 1e-6
            assert torch.allclose(a[firm], b[firm], rtol=0, atol=1e-6)
            assert (a - b).abs().max() <= 2e-3 + 1e-6
    assert all(torch.equal(a, b) for a, b in zip(ranks[0]["weights"], ranks[1]["weights"]))  # one model, twice


def fixed_completions(trainer, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
    """TRL's sampling replaced by completions that are a function of the prompt and the row's
    place in its group, so that one process and two (each sampling its share of the rows) train
    on the same batch. Some groups hold no digit (digit_share 0: the filter drops them)."""
    tok, seen, out = trainer.processing_class, {}, []
    digits, letters = ([tok.convert_tokens_to_ids(c) for c in cs] for cs in ("0123456789", "abcdefxyz"))
    for ids in prompt_ids:
        k = seen[tuple(ids)] = seen.get(tuple(ids), -1) + 1
        group = random.Random(f"{ids}")  # (str seeds hash the same in every process)
        rng = random.Random(f"{ids}/{k}")
        pool = letters if group.random() < 0.3 else digits + letters
        out.append([rng.choice(pool) for _ in range(rng.randint(2, 7))] + [trainer.eos_token_ids[0]])
    return out, None


def trl_segment(rank, harness, base, out, size, rendezvous):
    """One TRL step of the real segment path (join, accelerate, DDP), sampling fixed."""
    from evotrainer.trainer import jobs, trl_backend
    from evotrainer.runtime import Runtime
    trl_backend.HarnessGRPOTrainer._generate_single_turn = fixed_completions
    torch.set_num_threads(1)
    runtime = Runtime("trl", data_parallel=size).to_dict()
    jobs._segment(rank, task="arith", level=2, harness=harness, base=base, out=out, seed=0, steps=1,
                  runtime=runtime, draws=None, eval_every=0, replica=0)


@pytest.mark.slow
@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
def test_trl_over_two_processes_takes_the_step_one_process_takes(tmp_path, tiny_qwen, agg):
    # token_mean: TRL's denominator is the kept tokens of both processes; seq_mean_token_mean:
    # the mean over kept rows of the whole batch, not of each process's share
    from evotrainer.policy import load_policy
    h = write_harness(tmp_path / "h", {"reward.py": DIGITS}, prompts_per_step=6, group_size=4, reward="digit_share",
                      loss_agg=agg, group_filter="drop_dead", lr=1e-3)
    one, two = tmp_path / "one", tmp_path / "two"
    trl_segment(0, str(h), tiny_qwen, str(one), 1, "")
    mp.spawn(trl_segment, args=(str(h), tiny_qwen, str(two), 2, str(tmp_path / "rendezvous")), nprocs=2, join=True)
    records = [[json.loads(line) for line in (d / "evidence.jsonl").read_text().splitlines()] for d in (one, two)]
    assert len(records[1]) == 24 and [r["completion"] for r in records[0]] == [r["completion"] for r in records[1]]
    assert [r["advantage"] for r in records[0]] == pytest.approx([r["advantage"] for r in records[1]], abs=1e-6)
    kept = [r["kept"] for r in records[1]]
    assert 0 < sum(kept) < 24  # the filter dropped a group, so the kept-row weighting is exercised
    assert json.loads((two / "run.json").read_text())["data_parallel"] == 2
    base = dict(load_policy(tiny_qwen)[0].named_parameters())
    w1, w2 = (dict(load_policy(d / "checkpoint")[0].named_parameters()) for d in (one, two))
    moved = max(float((w1[n] - base[n]).abs().max()) for n in base)
    assert moved > 5e-4  # Adam's first step moves a weight by about lr
    # Adam's first step is lr x g / (|g| + eps): agreement to a twentieth of lr (see above)
    assert all(torch.allclose(w1[n], w2[n], rtol=0, atol=5e-5) for n in w1)


def test_what_data_parallelism_cannot_do_yet_is_refused_in_one_line():
    from evotrainer.errors import UsageError
    from evotrainer.runtime import Runtime
    from evotrainer.trainer.backends import check_backend
    knobs = load_harness(None).knobs  # the reference: 64 prompts x 8
    with pytest.raises(UsageError, match="data_parallel 3 does not divide the batch of 512 rollouts"):
        check_backend(Runtime("trl", data_parallel=3), knobs)
    check_backend(Runtime("trl", data_parallel=2), knobs)
    with pytest.raises(UsageError, match="data_parallel must be an integer >= 1, got 0"):
        Runtime(data_parallel=0).validate()
    with pytest.raises(UsageError, match="cannot train the multi-turn task vault yet"):
        check_backend(Runtime(data_parallel=2), load_harness(None).knobs, task=get_task("vault"))


@pytest.mark.slow
def test_train_with_two_processes_records_the_whole_batch_once_and_saves_one_checkpoint(tmp_path, tiny_qwen,
                                                                                     capsys):
    from helpers import here
    import json
    h = write_harness(tmp_path / "h", {"reward.py": DIGITS}, reward="digit_share", lr=3e-3, prompts_per_step=6,
                      group_size=4)
    out = tmp_path / "out"
    summary = here(capsys, "train", "--task", "arith", "--level", "2", "--model", tiny_qwen, "--harness", h,
                   "--data-parallel", 2, "--steps", 4, "--eval-every", 2, "--out", out).json
    assert json.loads((out / "run.json").read_text())["data_parallel"] == 2
    records = [json.loads(line) for line in (out / "evidence.jsonl").read_text().splitlines()]
    assert len(records) == 4 * 6 * 4 and len((out / "metrics.jsonl").read_text().splitlines()) == 4
    # each step's 6 prompts, 3 sampled by each rank, recorded once by rank 0 in the batch's order
    assert all(sorted(r["group_id"] for r in records if r["step"] == s) == sorted(list(range(6)) * 4)
               for s in range(1, 5))
    assert {p.name for p in (out / "checkpoints").iterdir()} == {"step-2"} and (out / "checkpoint").is_dir()
    assert not (out / ".rendezvous").exists() and 0 <= summary["val"] <= 1

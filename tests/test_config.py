"""The run config: every key checked before any work, one line naming the key."""
import pytest

from evotrainer.config import RunConfig, config_from_dict, load_config
from evotrainer.errors import UsageError


def load(tmp_path, text):
    p = tmp_path / "run.yaml"
    p.write_text(text)
    return load_config(p)


def test_a_full_config_loads_with_types(tmp_path):
    cfg = load(tmp_path, "task: arith\nlevel: 3\nsearch: {mode: restart}\nseeds: [0, 1, 2]\n"
                         "base: {target_acc: 0.1}\nbudget: {trials: 4, wall_clock_s: 600}\n"
                         "promotion: {alpha: 0.05}\nevaluation: {every: 10}\n")
    assert cfg.search.restarts and cfg.seeds == (0, 1, 2) and cfg.base.target_acc == 0.1
    assert cfg.budget.trials == 4 and cfg.budget.wall_clock_s == 600.0 and cfg.promotion.alpha == 0.05
    assert cfg.evaluation.every == 10 and cfg.evaluation.last_k == 2 and cfg.promotion.replicas == 2
    assert cfg.budget.steps_per_segment == 50  # untouched defaults stay
    assert load(tmp_path, "task: rg:chain_sum\n") == RunConfig(task="rg:chain_sum")
    cfg = load(tmp_path, "task: arith\nagent: llm\nllm: {base_url: 'http://localhost:8000/v1', model: m}\n"
                         "approval: {at: [design, completion], after_failures: 2}\n")
    assert cfg.llm.model == "m" and cfg.llm.repair_turns == 2 and cfg.approval.at == ("design", "completion")


def test_keys_that_moved_are_read_where_they_live_now_with_one_line_each(tmp_path, capsys):
    """A config (or a run directory's config.yaml) written before the renames still runs."""
    old = load(tmp_path, "task: arith\npolicy: restart\ngate: {alpha: 0.05, replicas: 1}\n"
                         "gates: [design]\ngate_after_failures: 3\nsearch: {population: 2}\n")
    new = load(tmp_path, "task: arith\nsearch: {mode: restart, population: 2}\n"
                         "promotion: {alpha: 0.05, replicas: 1}\napproval: {at: [design], after_failures: 3}\n")
    assert old == new and old.search.restarts and old.search.population == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line]
    assert lines == [f"config: '{a}' is now '{b}' (read as that; rename it to silence this line)" for a, b in
                     [("policy", "search.mode"), ("gate", "promotion"), ("gates", "approval.at"),
                      ("gate_after_failures", "approval.after_failures")]]


@pytest.mark.parametrize("text, words", [
    ("task: arith\nturbo: true\n", ["unknown key 'turbo'", "budget"]),
    ("task: arith\nbudget: {trails: 3}\n", ["unknown key 'budget.trails'", "trials"]),
    ("level: 3\n", ["missing key 'task'"]),
    ("task: arith\nbudget: {trials: -1}\n", ["'budget.trials' must be > 0, got -1"]),
    ("task: arith\nbudget: {wall_clock_s: 0}\n", ["'budget.wall_clock_s' must be > 0"]),
    ("task: arith\nbudget: {steps_per_segment: 500}\n", ["'budget.steps_per_segment' must be <= budget.total_steps"]),
    ("task: arith\nseeds: [0, 0]\n", ["'seeds' must be distinct"]),
    ("task: arith\nseeds: 3\n", ["'seeds' must be a list of integers"]),
    ("task: arith\nsearch: {mode: greedy}\n", ["'search.mode' must be one of continue, restart"]),
    ("task: arith\npolicy: restart\nsearch: {mode: restart}\n", ["'policy' and 'search.mode' both given"]),
    ("task: arith\ngate: {}\npromotion: {}\n", ["'gate' and 'promotion' both given"]),
    ("task: arith\nbudget: {trials: many}\n", ["'budget.trials' must be int, got 'many'"]),
    ("task: arith\nbudget: 3\n", ["'budget' must be a mapping"]),
    ("task: arith\nevaluation: {last_k: 0}\n", ["'evaluation.last_k' must be >= 1"]),
    ("task: arith\nevaluation: {every: -1}\n", ["'evaluation.every' must be >= 0"]),
    ("task: arith\ngate: {last_k: 2}\n", ["'gate.last_k' is now 'evaluation.last_k'"]),
    ("task: arith\ngate: {z: 2.0}\n", ["'gate.z' is now 'promotion.alpha'"]),
    ("task: arith\npromotion: {alpha: 0.7}\n", ["'promotion.alpha' must be in (0, 0.5)"]),
    ("task: arith\nseeds: [0]\npromotion: {replicas: 0}\n", ["'promotion.replicas' must be >= 1"]),
    ("task: arith\npromotion: {extra_pairs: -1}\n", ["'promotion.extra_pairs' must be >= 0"]),
    ("task: [arith\n", ["malformed YAML"]),
    ("task: arith\napproval: {at: [design, review]}\n",
     ["'approval.at' must name points among design, backtest, completion", "'review'"]),
    ("task: arith\napproval: {at: design}\n", ["'approval.at' must be a list of names"]),
    ("task: arith\nagent: gpt\n", ["'agent' must be one of rules, random, llm, command"]),
    ("task: arith\nagent: command\n", ["'command.run' must give the command line"]),
    ("task: arith\nagent: llm\nllm: {repair_turns: -1}\n", ["'llm.repair_turns' must be >= 0"]),
    ("task: arith\nllm: {modle: x}\n", ["unknown key 'llm.modle'", "model"]),
    ("task: arith\nexecutor: slurm\n", ["'executor' must be one of local, ray, got 'slurm'"]),
    ("task: arith\nexecutor: ray\nray: {address: 'head node'}\n", ["'ray.address' must be local, auto, HOST:PORT"]),
    ("task: arith\nexecutor: ray\nray: {num_cpus: 0}\n", ["'ray.num_cpus' must be > 0, got 0"]),
    ("task: arith\nexecutor: ray\nray: {num_gpus: -1}\n", ["'ray.num_gpus' must be >= 0 or null (auto)"]),
    ("task: arith\nexecutor: ray\nray: {retries: -2}\n", ["'ray.retries' must be >= 0"]),
])
def test_bad_config_is_one_line_naming_the_key(tmp_path, text, words):
    with pytest.raises(UsageError) as e:
        load(tmp_path, text)
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


def test_the_executor_from_the_config(tmp_path, monkeypatch):
    from evotrainer.executors import LocalPool
    assert load(tmp_path, "task: arith\nworkers: 3\n").job_executor() == LocalPool(3)
    cfg = load(tmp_path, "task: arith\ndevice: cuda\nexecutor: ray\nray: {address: '10.0.0.5:6379', num_cpus: 4, "
                         "num_gpus: 0.5, retries: 1}\n")
    ex = cfg.job_executor()
    assert (ex.address, ex.num_cpus, ex.num_gpus, ex.retries, ex.device) == ("10.0.0.5:6379", 4.0, 0.5, 1, "cuda")
    assert load(tmp_path, "task: arith\nexecutor: ray\nray: {address: 'ray://head:10001'}\n").ray.num_gpus is None
    import importlib.util
    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else find(name, *a))
    with pytest.raises(UsageError, match=r"Ray is not installed: pip install 'evotrainer\[ray\]'"):
        load(tmp_path, "task: arith\nexecutor: ray\n")


def test_missing_file():
    with pytest.raises(UsageError, match="no run config at"):
        load_config("/nonexistent/run.yaml")


def test_bool_is_not_an_int():
    with pytest.raises(UsageError, match="'budget.trials' must be int, got True"):
        config_from_dict({"task": "arith", "budget": {"trials": True}})


def test_base_sft_settings_and_a_harness_beside_the_config(tmp_path):
    (tmp_path / "h").mkdir()
    (tmp_path / "h" / "knobs.yaml").write_text("prompts_per_step: 8\n")
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("task: vault\nharness: h\nbase:\n  max_steps: 250\n  batch_size: 32\n  require_target: false\n")
    cfg = load_config(cfg_file)
    assert cfg.harness == str((tmp_path / "h").resolve())   # found from any working directory
    p = cfg.base.pretrain_config()
    assert (p.max_steps, p.batch_size, cfg.base.require_target) == (250, 32, False)
    assert load_config_default_steps(tmp_path) == 1500  # the task's own
    cfg_file.write_text("task: vault\nbase:\n  max_steps: -1\n")
    with pytest.raises(UsageError, match="base.max_steps"):
        load_config(cfg_file)


def load_config_default_steps(tmp_path):
    f = tmp_path / "d.yaml"
    f.write_text("task: vault\n")
    from evotrainer.catalog import get_task
    from evotrainer.trainer.pretrain import resolved
    return resolved(get_task("vault"), load_config(f).base.pretrain_config()).max_steps


def test_a_ray_address_where_nothing_answers_stops_the_run_before_it_starts(tmp_path, capsys):
    pytest.importorskip("ray")
    import socket

    from evotrainer.cli import main
    with socket.socket() as s:  # a port nothing listens on once it is closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"task: arith\nlevel: 1\nexecutor: ray\nray: {{address: '127.0.0.1:{port}'}}\n")
    assert main(["run", str(cfg), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert f"nothing answers at '127.0.0.1:{port}'" in err and "ray start --head" in err and "\n" not in err
    assert not (tmp_path / "run").exists()  # nothing started, nothing to resume

"""The run configuration of `evotrainer run`: typed, loaded from YAML, validated before any work.

    task: arith                  # required: a task spec (evotrainer.tasks.get_task): arith, rg:<family>,
                                 # jsonl:PATH?verifier=exact|numeric|math, package.module:Factory,
                                 # file.py:Factory, or an `evotrainer.tasks` entry-point name
    level: 3                     # the task's target level (arith: digits)
    model: null                  # the policy: a Hugging Face causal LM (a directory, or a hub id already
                                 # in the local cache); null: the built-in tiny model, SFT'd as `base:` says
    backend: embedded            # who trains a segment: embedded (our GRPO trainer) or trl (TRL's GRPOTrainer)
    dtype: auto                  # auto | fp32 | bf16 | fp16: autocast precision of the passes
    weights: fp32                # fp32 | bf16: the dtype the weights (and AdamW's moments) are held in
    lora: null                   # LoRA adapters instead of full fine-tuning (pip install 'evotrainer[peft]'):
                                 # {rank: 16, alpha: 32, dropout: 0.0, target_modules: all-linear}; each
                                 # checkpoint holds the adapter only, on the run's model (policy/adapters.py)
    gradient_checkpointing: false  # recompute activations in the backward pass: less memory, more compute
    data_parallel: 1             # training processes per segment (one per GPU; gloo on a CPU), each a
                                 # share of every step's prompts, gradients summed: the one-process update
    device: auto                 # auto (cuda, then mps, then cpu) | cpu | cuda | cuda:N | mps
    chat_template: true          # wrap prompts in the tokenizer's chat template when it has one
    micro_batch_size: 0          # rollouts per forward/backward, gradients accumulated (0: all at once)
    worker_memory_mb: 8192       # a training or evaluation worker is killed (oom) past this resident memory
    sandbox: auto                # isolation of every worker that runs untrusted code (evotrainer.sandbox):
                                 # auto (namespaces where the machine allows them, else process limits,
                                 # said loudly in every report) | namespaces | limits | none (opt out)
    trl:                         # backend: trl only
      use_vllm: false            # sample with vLLM (pip install vllm) instead of transformers' generate
      vllm_mode: colocate        # colocate (in the training process) or server (`trl vllm-serve`)
    harness: null                # root harness directory (default: the reference)
    seeds: [0, 1]                # training seeds, paired across versions
    final_seeds: [100, 101, 102, 103, 104]  # fresh seeds of the final comparison (never used by the
                                 # search); 5: a t interval over 3 has 2 df and misses most real gains
    cache: run                   # trained segments and their scores, reused instead of training again
                                 # (evolve/segment_cache.py): run (RUN/cache, this run's own) | off |
                                 # an absolute directory that several runs or benchmark arms share
    workers: 0                   # training workers at once (0: one per core, at most one per job)
    executor: local              # where training and evaluation jobs run: local (a pool of `workers`
                                 # on this machine) | ray (each job a Ray task, sandboxed on its node)
    ray:                         # executor: ray (pip install 'evotrainer[ray]'; docs/scaling.md)
      address: local             # local (a one-machine cluster started here) | auto (the cluster this
                                 # machine belongs to) | HOST:PORT (a head node) | ray://HOST:PORT (Ray Client)
      num_cpus: 1                # CPUs a job asks for (also its torch threads)
      num_gpus: null             # GPUs a job asks for; null: data_parallel where `device` is cuda, or auto on a
                                 # cluster with GPUs, else 0 (0.5: two jobs share a GPU)
      memory_mb: 0               # memory a job reserves in Ray's scheduler (0: none reserved;
                                 # worker_memory_mb still kills a job past it)
      retries: 2                 # a job lost with its worker or node runs again at most this often
    agent: rules                 # rules (offline, deterministic), random (the baseline), llm or command
    llm:                         # agent: llm, any OpenAI-compatible chat endpoint (hosted, vLLM, Ollama)
      base_url: null             # null: the SDK's OPENAI_BASE_URL, else api.openai.com
      model: null                # null: $OPENAI_MODEL
      api_key_env: OPENAI_API_KEY  # the variable the key is read from (a local server needs none)
      timeout_s: 120             # one request; past it the SDK retries with backoff
      max_retries: 2
      repair_turns: 2            # replies that fail to parse, apply or pass legality, sent back to fix
      temperature: 0.2
      max_tokens: 4096
      token_limit: max_tokens    # the request field max_tokens is sent as: max_tokens (vLLM, Ollama,
                                 # llama.cpp) or max_completion_tokens (OpenAI's reasoning models)
      json_mode: true            # ask for response_format json_object (turn off for servers without it)
    command:                     # agent: command, an external coding agent run in a worktree of the parent
      run: null                  # e.g. "my-agent --brief {brief}"; the brief also arrives on stdin
      timeout_s: 900
    approval:                    # a person in the loop (evolve/approval.py)
      at: []                     # pause for `evotrainer approve/revise/abort RUN TRIAL` at: design,
                                 # backtest, completion
      after_failures: 0          # N > 0: after N failures in a row, pause at the next design too
    search:
      mode: continue             # continue: a version trains on from its parent's checkpoint
                                 # restart: every version retrains from the base (published protocol)
      selection: population      # population (GEAR-style elites) or greedy (keep-or-revert on the best)
      population: 4              # elites kept
      crossover: true            # merge two elites' harness changes when none happened lately
      escalation: true           # after 3 failures in a row: subtract, switch layer, roll back
      controller: fixed          # fixed: the search's policy as above, all run long; evolving: revised
                                 # every revise_every trials from the lineage (evolve/search_policy.py)
      revise_every: 3
      winner: trained            # what the final comparison retrains: trained, the best validated
                                 # of every version trained, kept or discarded, as a sweep picks (the
                                 # gate on 2 seeds discards real gains; the final comparison's fresh
                                 # seeds judge the pick); kept: the best validated the gate kept
      seed: null                 # the search's own draws (a random agent's choices, the population's
                                 # parent draws): null follows the run's first seed; another value
                                 # explores differently on the same training seeds
      concurrency: 1             # trials in flight at once, each from a specialist for one surface
                                 # (reward, data, optimisation, exploration, diagnostics); two in flight
                                 # never change one surface of one parent (evolve/specialists.py)
      skills: ~/.local/share/evotrainer/skills.sqlite   # the skill library (null: none; the
                                 # default follows $XDG_DATA_HOME where it is set)
    base:                        # the built-in tiny model's SFT base (when no `model` is given)
      target_acc: 0              # the cached base's SFT stops here (0: the task's own, 0.25; vault 0.1)
      seed: 0
      warm_start: null           # 0: SFT from scratch; N: continue from the level-N base; null: the
                                 # task's own (arith: the level below, from 3 digits up)
      max_steps: 0               # SFT steps at most (0: the task's own, 1500; swe-mini 250)
      batch_size: 0              # SFT batch (0: the task's own, 128; swe-mini 32: long episodes)
      require_target: null       # false: keep the base SFT reached in max_steps, short of target_acc
                                 # or not; null: the task's own (true; swe-mini false)
    budget:
      trials: 8                  # versions proposed, whatever becomes of them
      steps_per_segment: 50      # training steps a version adds (continue mode)
      total_steps: 300           # the reference recipe's training budget (and restart mode's)
      wall_clock_s: 3600         # no trial starts past this (over all sessions: a resume gets what is left)
      trial_timeout_s: 900       # a segment's worker is killed past this
    tracking:                    # experiment trackers (each an optional extra, imported only when named)
      report_to: []              # tensorboard | wandb | mlflow | trackio: per-step training metrics,
                                 # trial outcomes, the final table; the TRL backend gets the same list
      project: evotrainer        # the W&B / MLflow / trackio project
      wandb_mode: offline        # offline (RUN/trackers/wandb; `wandb sync` later) | online
      mlflow_uri: null           # null: a SQLite store, RUN/trackers/mlflow/mlflow.db
    evaluation:                  # what the evaluator measures and when: the run's, never a harness's
      every: 25                  # a segment saves a checkpoint for greedy validation every this many
                                 # steps (0: only at its end)
      last_k: 2                  # a segment's fitness: the mean of its last k evaluations, never one number
    promotion:                   # the promotion gate (evolve/gate.py), a sequential test
      alpha: 0.025               # the rate at which a child with no effect is kept, all looks together
      min_gain: 0.01             # the gain's lower confidence bound must clear this (about 2x the
                                 # sampling error of 500 problems)
      replicas: 2                # re-runs of the root segment on the same problems with other sampling
                                 # seeds: they measure the null (the spread of a difference when nothing
                                 # changed); 0: the seeds' own spread alone (2+ seeds; little power)
      extra_pairs: 2             # an inconclusive but promising child trains this many more paired
                                 # seeds, one at a time, before it is decided (0: decide on `seeds` alone)

Every key is checked: an unknown one, a wrong type or a negative budget is one line naming
the key and what is allowed, raised before anything runs. A key that moved (`policy`, `gate`,
`gates`, `gate_after_failures` before 0.2) is still read, with one line on stderr saying where
it lives now; a key whose meaning changed is refused with that line instead.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from evotrainer.errors import UsageError
from evotrainer.paths import DATA
from evotrainer.policy.adapters import LoraSpec
from evotrainer.policy.config import PolicyConfig
from evotrainer.runtime import Runtime
from evotrainer.sandbox import CHOICES as SANDBOXES

MODES = ("continue", "restart")
AGENTS = ("rules", "random", "llm", "command")
APPROVAL_POINTS = ("design", "backtest", "completion")
TOKEN_LIMITS = ("max_tokens", "max_completion_tokens")
SELECTIONS = ("population", "greedy")
CONTROLLERS = ("fixed", "evolving")
WINNERS = ("kept", "trained")
EXECUTORS = ("local", "ray")
CACHES = ("run", "off")  # or an absolute directory path
RAY_ADDRESS = re.compile(r"(ray://)?[A-Za-z0-9_.\-\[\]:]+:\d+")
DEFAULT_SKILLS = str(DATA / "skills.sqlite")  # $XDG_DATA_HOME/evotrainer, default ~/.local/share/evotrainer
RENAMED = {  # keys whose meaning changed: refused, with one line saying what replaced them
    "base.checkpoint": "is now the top-level key 'model' (any causal LM directory)",
    "gate.z": "is now 'promotion.alpha', the false-keep rate (z 2.0 was about alpha 0.025)",
    "gate.last_k": "is now 'evaluation.last_k' (what the evaluator averages is the run's, not the gate's)",
}
MOVED = {  # keys that only moved (one name, one meaning): still read, with one line saying where
    "policy": "search.mode",                          # `policy/` is the model; this was the search's mode
    "gate": "promotion",                              # the promotion gate, not a person's approval
    "gates": "approval.at",                           # the points where a person approves
    "gate_after_failures": "approval.after_failures",
}


@dataclass(frozen=True)
class BaseConfig:
    target_acc: float = 0.0
    seed: int = 0
    warm_start: int | None = None
    max_steps: int = 0
    batch_size: int = 0
    require_target: bool | None = None

    def pretrain_config(self):
        """The PretrainConfig this section asks for (0 and None: the task's own, pretrain.resolved)."""
        from evotrainer.trainer.pretrain import PretrainConfig
        return PretrainConfig(target_acc=self.target_acc, seed=self.seed, warm_start=self.warm_start,
                              max_steps=self.max_steps, batch_size=self.batch_size)


@dataclass(frozen=True)
class TRLConfig:
    use_vllm: bool = False
    vllm_mode: str = "colocate"


@dataclass(frozen=True)
class Budget:
    trials: int = 8
    steps_per_segment: int = 50
    total_steps: int = 300
    wall_clock_s: float = 3600.0
    trial_timeout_s: float = 900.0


@dataclass(frozen=True)
class PromotionConfig:
    alpha: float = 0.025
    min_gain: float = 0.01
    replicas: int = 2
    extra_pairs: int = 2


@dataclass(frozen=True)
class EvalConfig:
    every: int = 25
    last_k: int = 2


@dataclass(frozen=True)
class TrackingConfig:
    report_to: tuple[str, ...] = ()
    project: str = "evotrainer"
    wandb_mode: str = "offline"
    mlflow_uri: str | None = None


@dataclass(frozen=True)
class RayConfig:
    address: str = "local"
    num_cpus: float = 1.0
    num_gpus: float | None = None
    memory_mb: int = 0
    retries: int = 2


@dataclass(frozen=True)
class SearchConfig:
    mode: str = "continue"
    selection: str = "population"
    population: int = 4
    crossover: bool = True
    escalation: bool = True
    skills: str | None = DEFAULT_SKILLS
    controller: str = "fixed"    # the search's own policy: fixed, or evolving (evolve/search_policy.py)
    revise_every: int = 3        # an evolving controller's trials between revisions
    concurrency: int = 1         # trials in flight at once (evolve/specialists.py)
    seed: int | None = None      # the search's own draws; None: the run's first seed
    winner: str = "trained"      # the final comparison's pick among every trained version, or kept ones

    @property
    def restarts(self) -> bool:
        """Every version retrains from the base (restart) rather than from its parent's checkpoint."""
        return self.mode == "restart"


@dataclass(frozen=True)
class ApprovalConfig:
    at: tuple[str, ...] = ()
    after_failures: int = 0


@dataclass(frozen=True)
class LLMConfig:
    """The `llm` agent's endpoint: the official openai SDK, so any server that speaks the
    chat-completions protocol works (OpenAI, vLLM, SGLang, Ollama, llama.cpp)."""
    base_url: str | None = None
    model: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 120.0
    max_retries: int = 2
    repair_turns: int = 2
    temperature: float = 0.2
    max_tokens: int = 4096
    token_limit: str = "max_tokens"
    json_mode: bool = True


@dataclass(frozen=True)
class CommandConfig:
    """The `command` agent: `run` is a shell command line; {brief}, {worktree} and {proposal}
    in it are replaced by the brief file, the worktree and where it may write its proposal."""
    run: str | None = None
    timeout_s: float = 900.0


@dataclass(frozen=True)
class RunConfig:
    task: str
    level: int | None = None
    model: str | None = None
    backend: str = "embedded"
    dtype: str = "auto"
    weights: str = "fp32"
    lora: dict | None = None
    gradient_checkpointing: bool = False
    data_parallel: int = 1
    device: str = "auto"
    chat_template: bool = True
    micro_batch_size: int = 0
    worker_memory_mb: int = 8192
    sandbox: str = "auto"
    trl: TRLConfig = field(default_factory=TRLConfig)
    harness: str | None = None
    seeds: tuple[int, ...] = (0, 1)
    final_seeds: tuple[int, ...] = (100, 101, 102, 103, 104)
    cache: str = "run"
    workers: int = 0
    executor: str = "local"
    ray: RayConfig = field(default_factory=RayConfig)
    agent: str = "rules"
    llm: LLMConfig = field(default_factory=LLMConfig)
    command: CommandConfig = field(default_factory=CommandConfig)
    approval: ApprovalConfig = field(default_factory=ApprovalConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    base: BaseConfig = field(default_factory=BaseConfig)
    budget: Budget = field(default_factory=Budget)
    evaluation: EvalConfig = field(default_factory=EvalConfig)
    promotion: PromotionConfig = field(default_factory=PromotionConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def validate(self) -> "RunConfig":
        def need(ok: bool, key: str, msg: str):
            if not ok:
                raise UsageError(f"config: '{key}' {msg}")
        need(bool(self.task), "task", "must name a task (arith, rg:<family>, jsonl:PATH, module:Factory, ...)")
        need(self.worker_memory_mb >= 0, "worker_memory_mb", f"must be >= 0 (0: no limit), got {self.worker_memory_mb}")
        try:
            self.runtime().validate(here=self.executor == "local")
        except UsageError as e:
            raise UsageError(f"config: {e}") from None
        need(self.sandbox in SANDBOXES, "sandbox", f"must be one of {', '.join(SANDBOXES)}, got '{self.sandbox}'")
        need(self.search.mode in MODES, "search.mode", f"must be one of {', '.join(MODES)}, got '{self.search.mode}'")
        need(self.agent in AGENTS, "agent", f"must be one of {', '.join(AGENTS)}, got '{self.agent}'")
        bad = [g for g in self.approval.at if g not in APPROVAL_POINTS]
        need(not bad, "approval.at", f"must name points among {', '.join(APPROVAL_POINTS)}, got {bad[0] if bad else ''!r}")
        need(self.approval.after_failures >= 0, "approval.after_failures",
             f"must be >= 0, got {self.approval.after_failures}")
        if self.agent == "llm":
            need(self.llm.timeout_s > 0, "llm.timeout_s", f"must be > 0, got {self.llm.timeout_s}")
            need(self.llm.max_retries >= 0, "llm.max_retries", f"must be >= 0, got {self.llm.max_retries}")
            need(self.llm.repair_turns >= 0, "llm.repair_turns", f"must be >= 0, got {self.llm.repair_turns}")
            need(self.llm.max_tokens > 0, "llm.max_tokens", f"must be > 0, got {self.llm.max_tokens}")
            need(self.llm.token_limit in TOKEN_LIMITS, "llm.token_limit",
                 f"must be one of {', '.join(TOKEN_LIMITS)}, got '{self.llm.token_limit}'")
            need(0 <= self.llm.temperature <= 2, "llm.temperature", f"must be in [0, 2], got {self.llm.temperature}")
        if self.agent == "command":
            need(bool((self.command.run or "").strip()), "command.run", "must give the command line of the agent to run")
            need(self.command.timeout_s > 0, "command.timeout_s", f"must be > 0, got {self.command.timeout_s}")
        need(len(self.seeds) >= 1 and len(set(self.seeds)) == len(self.seeds), "seeds",
             f"must be distinct seeds, at least one, got {list(self.seeds)}")
        need(len(set(self.final_seeds)) == len(self.final_seeds) and not set(self.final_seeds) & set(self.seeds),
             "final_seeds", f"must be distinct and never used by the search (seeds {list(self.seeds)}), "
             f"got {list(self.final_seeds)}")
        need(self.search.selection in SELECTIONS, "search.selection",
             f"must be one of {', '.join(SELECTIONS)}, got '{self.search.selection}'")
        need(self.search.population >= 1, "search.population", f"must be >= 1, got {self.search.population}")
        need(self.search.controller in CONTROLLERS, "search.controller",
             f"must be one of {', '.join(CONTROLLERS)}, got '{self.search.controller}'")
        need(self.search.winner in WINNERS, "search.winner",
             f"must be one of {', '.join(WINNERS)}, got '{self.search.winner}'")
        need(self.search.revise_every >= 1, "search.revise_every", f"must be >= 1, got {self.search.revise_every}")
        need(self.search.seed is None or (isinstance(self.search.seed, int) and not isinstance(self.search.seed, bool)),
             "search.seed", f"must be an integer or null, got {self.search.seed!r}")
        need(self.search.concurrency >= 1, "search.concurrency",
             f"must be >= 1 (trials in flight at once), got {self.search.concurrency}")
        need(self.search.concurrency == 1 or not (self.approval.at or self.approval.after_failures), "approval",
             "a person's gates pause one trial at a time: set search.concurrency: 1, or approval.at: [] "
             "and approval.after_failures: 0")
        need(self.cache in CACHES or Path(self.cache).expanduser().is_absolute(), "cache",
             f"must be run (a cache inside the run directory), off, or an absolute directory path "
             f"(shared by every run pointed at it), got '{self.cache}'")
        need(self.cache in CACHES or not Path(self.cache).expanduser().is_file(), "cache",
             f"must be a directory, but '{self.cache}' is a file")
        need(self.workers >= 0, "workers", f"must be >= 0 (0: one per core), got {self.workers}")
        need(self.executor in EXECUTORS, "executor", f"must be one of {', '.join(EXECUTORS)}, got '{self.executor}'")
        if self.executor == "ray":
            r = self.ray
            need(r.address in ("local", "auto") or bool(RAY_ADDRESS.fullmatch(r.address)), "ray.address",
                 f"must be local, auto, HOST:PORT or ray://HOST:PORT, got '{r.address}'")
            need(r.num_cpus > 0, "ray.num_cpus", f"must be > 0, got {r.num_cpus}")
            need(r.num_gpus is None or r.num_gpus >= 0, "ray.num_gpus", f"must be >= 0 or null (auto), got {r.num_gpus}")
            need(r.memory_mb >= 0, "ray.memory_mb", f"must be >= 0 (0: none reserved), got {r.memory_mb}")
            need(r.retries >= 0, "ray.retries", f"must be >= 0, got {r.retries}")
            need(importlib.util.find_spec("ray") is not None, "executor",
                 "is ray, but Ray is not installed: pip install 'evotrainer[ray]'")
        need(self.base.warm_start is None or self.base.warm_start >= 0, "base.warm_start", f"must be >= 0 (0: from scratch), got {self.base.warm_start}")
        need(0 <= self.base.target_acc <= 1, "base.target_acc",
             f"must be in [0, 1] (0: the task's own), got {self.base.target_acc}")
        need(self.base.max_steps >= 0 and self.base.batch_size >= 0, "base.max_steps",
             f"max_steps and batch_size must be >= 0 (0: the default), got {self.base.max_steps} and {self.base.batch_size}")
        b = self.budget
        for key in ("trials", "steps_per_segment", "total_steps", "wall_clock_s", "trial_timeout_s"):
            need(getattr(b, key) > 0, f"budget.{key}", f"must be > 0, got {getattr(b, key)}")
        need(b.steps_per_segment <= b.total_steps or self.search.restarts, "budget.steps_per_segment",
             f"must be <= budget.total_steps ({b.total_steps}), got {b.steps_per_segment}")  # restart: unused
        g = self.promotion
        need(0 < g.alpha < 0.5, "promotion.alpha", f"must be in (0, 0.5), got {g.alpha}")
        need(g.min_gain >= 0, "promotion.min_gain", f"must be >= 0, got {g.min_gain}")
        need(g.replicas >= 1 or (g.replicas == 0 and len(self.seeds) >= 2), "promotion.replicas",
             f"must be >= 1 (the gate's null is measured by them), or 0 with 2 or more seeds (the seeds' "
             f"own spread alone, which has little power), got {g.replicas} with {len(self.seeds)} seed(s)")
        need(g.extra_pairs >= 0, "promotion.extra_pairs", f"must be >= 0, got {g.extra_pairs}")
        need(self.evaluation.every >= 0, "evaluation.every", f"must be >= 0 (0: only at the end), got {self.evaluation.every}")
        need(self.evaluation.last_k >= 1, "evaluation.last_k", f"must be >= 1, got {self.evaluation.last_k}")
        from evotrainer.trackers import WANDB_MODES, check
        try:
            check(self.tracking.report_to)
        except UsageError as e:
            raise UsageError(f"config: 'tracking.report_to': {e}") from None
        need(self.tracking.wandb_mode in WANDB_MODES, "tracking.wandb_mode",
             f"must be one of {', '.join(WANDB_MODES)}, got '{self.tracking.wandb_mode}'")
        return self

    def job_executor(self):
        """The Executor every training and evaluation job of the run goes to."""
        from evotrainer.executors import LocalPool
        if self.executor == "ray":
            from evotrainer.executors.ray_tasks import RayExecutor
            r = self.ray
            return RayExecutor(r.address, r.num_cpus, r.num_gpus, r.memory_mb, r.retries, self.device, self.data_parallel)
        # trials in flight share the pool: its workers are a limit on them all, not on each trial
        return LocalPool(self.workers, shared=self.search.concurrency > 1)

    def cache_dir(self, run_dir: Path) -> Path | None:
        """Where the run's segment cache lives (None: off)."""
        if self.cache == "off":
            return None
        return Path(run_dir) / "cache" if self.cache == "run" else Path(self.cache).expanduser()

    def runtime(self) -> Runtime:
        """Backend, device and precision: what every training and evaluation job of the run shares."""
        policy = PolicyConfig(self.dtype, self.device, self.chat_template, self.weights, LoraSpec.of(self.lora))
        return Runtime(self.backend, policy, self.micro_batch_size, self.trl.use_vllm, self.trl.vllm_mode,
                       self.tracking.report_to, self.gradient_checkpointing, self.data_parallel)


def load_config(path: Path | str) -> RunConfig:
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"no run config at '{path}'")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        line = getattr(getattr(e, "problem_mark", None), "line", None)
        raise UsageError(f"{path}: malformed YAML{f' at line {line + 1}' if line is not None else ''}") from None
    cfg = config_from_dict(raw or {})
    if cfg.harness and not Path(cfg.harness).is_absolute() and (path.parent / cfg.harness).is_dir():
        # a harness shipped beside its config is found from any working directory
        cfg = dataclasses.replace(cfg, harness=str((path.parent / cfg.harness).resolve()))
    return cfg.validate()


def moved_keys(raw: dict) -> tuple[dict, list[str]]:
    """The config with every moved key (MOVED) put where it lives now, and one notice per move.
    A key whose meaning changed (RENAMED) is refused first, under the name the user wrote."""
    for old, why in RENAMED.items():
        section, _, key = old.partition(".")
        if isinstance(raw.get(section), dict) and key in raw[section]:
            raise UsageError(f"config: '{old}' {why}")
    raw, notices = dict(raw), []
    for old, new in MOVED.items():
        if old not in raw:
            continue
        *sections, key = new.split(".")
        if not sections and new in raw or sections and isinstance(raw.get(sections[0]), dict) and key in raw[sections[0]]:
            raise UsageError(f"config: '{old}' and '{new}' both given; '{old}' is the old name of '{new}', keep one")
        value = raw.pop(old)
        if sections:
            section = raw.get(sections[0], {})
            if not isinstance(section, dict):
                raise UsageError(f"config: '{sections[0]}' must be a mapping, got {type(section).__name__}")
            raw[sections[0]] = {**section, key: value}
        else:
            raw[new] = value
        notices.append(f"config: '{old}' is now '{new}' (read as that; rename it to silence this line)")
    return raw, notices


def config_from_dict(raw, cls=RunConfig, prefix: str = ""):
    """Build a (nested) config dataclass from plain data, naming the first bad key."""
    if not isinstance(raw, dict):
        raise UsageError(f"config: '{prefix.rstrip('.') or 'the file'}' must be a mapping, got {type(raw).__name__}")
    if cls is RunConfig:
        if isinstance(raw.get("cache"), bool):  # YAML 1.1 reads a bare `off` as false, `on` as true
            raw = {**raw, "cache": "run" if raw["cache"] else "off"}
        raw, notices = moved_keys(raw)
        for line in notices:
            print(line, file=sys.stderr)
    fields_ = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for key in raw:
        if key not in fields_:
            raise UsageError(f"config: unknown key '{prefix}{key}'; valid keys: {', '.join(fields_)}")
    missing = [n for n, f in fields_.items() if n not in raw and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise UsageError(f"config: missing key '{prefix}{missing[0]}'")
    return cls(**{k: _coerce(v, hints[k], f"{prefix}{k}") for k, v in raw.items()})


def _coerce(value, hint, key: str):
    if dataclasses.is_dataclass(hint):
        return config_from_dict(value, hint, f"{key}.")
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        hint = next(a for a in args if a is not type(None))
        args = typing.get_args(hint)
    if typing.get_origin(hint) is tuple:
        item = args[0]
        if not isinstance(value, list) or not all(type(v) is item for v in value):
            kind = "integers" if item is int else "names"
            raise UsageError(f"config: '{key}' must be a list of {kind}, got {value!r}")
        return tuple(value)
    ok = (type(value) is hint or (hint is float and type(value) is int))
    if not ok:
        raise UsageError(f"config: '{key}' must be {hint.__name__}, got {value!r}")
    return hint(value)

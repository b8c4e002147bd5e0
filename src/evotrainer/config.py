"""The run configuration of `evotrainer run`: typed, loaded from YAML, validated before any work.

Each key is a field below, and its default, allowed values and meaning are written there once
(`knob`, `section`). The loader reads them, so do the `train` command's flags (cli.py), and so
does the reference, docs/config.md, which `reference()` writes (scripts/config_reference.py);
a test keeps that page equal to what the fields say now.

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
from evotrainer.policy.config import DTYPES, WEIGHT_DTYPES, PolicyConfig
from evotrainer.runtime import BACKEND_NAMES, VLLM_MODES, Runtime
from evotrainer.sandbox import CHOICES as SANDBOXES
from evotrainer.trackers import TRACKERS, WANDB_MODES
from evotrainer.trackers import check as check_trackers

MODES = ("continue", "restart")
AGENTS = ("rules", "random", "llm", "command")
APPROVAL_POINTS = ("design", "backtest", "completion")
TOKEN_LIMITS = ("max_tokens", "max_completion_tokens")
SELECTIONS = ("population", "greedy")
CONTROLLERS = ("fixed", "evolving")
WINNERS = ("kept", "trained")
ORDERS = ("findings", "spread")
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


def knob(default=dataclasses.MISSING, help: str = "", choices: tuple[str, ...] = ()):
    """A key of the run config: its default (none: the key is required), what it does, and the
    names it may take; the loader, the `train` flags and docs/config.md all read these."""
    return field(default=default, metadata={"help": help, "choices": tuple(choices)})


def section(cls, help: str):
    """A mapping of keys (the dataclass `cls`), each at its default unless the config sets it."""
    return field(default_factory=cls, metadata={"help": help, "choices": ()})


def shown(value) -> str:
    """A value as a YAML config spells it. A path under the data directory is shown under
    $XDG_DATA_HOME, so the reference reads the same on every machine."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (tuple, list)):
        return f"[{', '.join(shown(v) for v in value)}]"
    if isinstance(value, str) and value.startswith(str(DATA)):
        return "$XDG_DATA_HOME/evotrainer" + value[len(str(DATA)):]
    return str(value)


# the runtime's own defaults (runtime.py, policy/): written once, there, and read here
_RUNTIME, _POLICY, _LORA = Runtime(), PolicyConfig(), LoraSpec()
_LORA_KEYS = ", ".join(f"{k}: {shown(getattr(_LORA, k))}" for k in ("rank", "alpha", "dropout", "target_modules"))


@dataclass(frozen=True)
class BaseConfig:
    target_acc: float = knob(0.0, "the base's SFT stops at this accuracy on a probe drawn from the train stream "
                             "(greedy; sampled for vault); 0: the task's own (0.25; vault 0.1)")
    seed: int = knob(0, "seed of the base's SFT (initialisation and data order)")
    warm_start: int | None = knob(None, "0: SFT from scratch; N: continue from the base of the lower level N; "
                                  "null: the task's own (arith: from the level below, from 3 digits up)")
    max_steps: int = knob(0, "SFT steps at most (0: the task's own, 1500; swe-mini 250)")
    batch_size: int = knob(0, "SFT batch (0: the task's own, 128; swe-mini 32: long episodes)")
    require_target: bool | None = knob(None, "false: keep the base SFT reached in max_steps, short of target_acc "
                                       "or not; null: the task's own (true; swe-mini false)")

    def pretrain_config(self):
        """The PretrainConfig this section asks for (0 and None: the task's own, pretrain.resolved)."""
        from evotrainer.trainer.pretrain import PretrainConfig
        return PretrainConfig(target_acc=self.target_acc, seed=self.seed, warm_start=self.warm_start,
                              max_steps=self.max_steps, batch_size=self.batch_size)


@dataclass(frozen=True)
class TRLConfig:
    use_vllm: bool = knob(_RUNTIME.use_vllm, "sample with vLLM (pip install vllm) instead of transformers' generate")
    vllm_mode: str = knob(_RUNTIME.vllm_mode, "colocate: in the training process, sharing its GPU; server: a "
                          "`trl vllm-serve` process", VLLM_MODES)


@dataclass(frozen=True)
class Budget:
    trials: int = knob(8, "versions proposed, whatever becomes of them")
    steps_per_segment: int = knob(50, "training steps a version adds (continue mode); at most total_steps")
    total_steps: int = knob(300, "the reference recipe's training budget (and restart mode's)")
    wall_clock_s: float = knob(3600.0, "no trial starts past this many seconds (over all sessions: a resume "
                               "gets what is left)")
    trial_timeout_s: float = knob(900.0, "a segment's worker is killed past this many seconds")


@dataclass(frozen=True)
class PromotionConfig:
    alpha: float = knob(0.025, "the rate at which a child with no effect is kept, all looks together")
    min_gain: float = knob(0.01, "the gain's lower confidence bound must clear this (about 2x the sampling "
                           "error of 500 problems)")
    replicas: int = knob(2, "re-runs of the root segment on the same problems with other sampling seeds: they "
                         "measure the null (the spread of a difference when nothing changed); 0: the seeds' own "
                         "spread alone (2+ seeds; little power)")
    extra_pairs: int = knob(2, "an inconclusive but promising child trains this many more paired seeds, one at "
                            "a time, before it is decided (0: decide on `seeds` alone)")


@dataclass(frozen=True)
class EvalConfig:
    every: int = knob(25, "a segment saves a checkpoint for greedy validation every this many steps (0: only "
                      "at its end); the schedule is the run's, never a harness's")
    last_k: int = knob(2, "a segment's fitness: the mean of its last k evaluations, never one number")


@dataclass(frozen=True)
class TrackingConfig:
    report_to: tuple[str, ...] = knob(_RUNTIME.report_to, "per-step training metrics, trial outcomes and the final "
                                      "table go to each tracker named; the TRL backend gets the same list", TRACKERS)
    project: str = knob("evotrainer", "the W&B / MLflow / trackio project")
    wandb_mode: str = knob("offline", "offline: RUN/trackers/wandb, `wandb sync` later; online", WANDB_MODES)
    mlflow_uri: str | None = knob(None, "null: a SQLite store, RUN/trackers/mlflow/mlflow.db")


@dataclass(frozen=True)
class RayConfig:
    address: str = knob("local", "local (a one-machine cluster started here), auto (the cluster this machine "
                        "belongs to), HOST:PORT (a head node) or ray://HOST:PORT (Ray Client)")
    num_cpus: float = knob(1.0, "CPUs a job asks for (also its torch threads)")
    num_gpus: float | None = knob(None, "GPUs a job asks for; null: data_parallel where `device` is cuda, or auto "
                                  "on a cluster with GPUs, else 0 (0.5: two jobs share a GPU)")
    memory_mb: int = knob(0, "memory a job reserves in Ray's scheduler (0: none reserved; worker_memory_mb still "
                          "kills a job past it)")
    retries: int = knob(2, "a job lost with its worker or node runs again at most this often")


@dataclass(frozen=True)
class SearchConfig:
    mode: str = knob("continue", "continue: a version trains on from its parent's checkpoint; restart: every "
                     "version retrains from the base (the published protocol)", MODES)
    selection: str = knob("population", "population: GEAR-style elites; greedy: keep-or-revert on the best",
                          SELECTIONS)
    population: int = knob(4, "elites kept")
    crossover: bool = knob(True, "merge two elites' harness changes when none happened lately")
    escalation: bool = knob(True, "after 3 failures in a row: subtract, switch layer, roll back")
    skills: str | None = knob(DEFAULT_SKILLS, "the skill library (null: none); $XDG_DATA_HOME is "
                              "~/.local/share where it is not set")
    controller: str = knob("fixed", "the search's own policy: fixed, the search as set here, all run long; "
                           "evolving: revised every revise_every trials from the lineage (evolve/search/policy.py)",
                           CONTROLLERS)
    revise_every: int = knob(3, "an evolving controller's trials between revisions")
    order: str = knob("findings", "the order the rules agent tries families in. findings: the families the "
                      "parent's findings name, each to its last move, then the rest in a fixed order; spread: "
                      "the families this run has tried least first (one move of each before a second of "
                      "any), the named ones leading among equals (on four landscape tables: +0.0 to +0.3 test "
                      "points at 8 trials, -0.8 at 16 on arith3-weak, whose best recipes stack two changes "
                      "on one lineage; docs/benchmarks.md)", ORDERS)
    concurrency: int = knob(1, "trials in flight at once, each from a specialist for one surface (reward, data, "
                            "optimisation, exploration, diagnostics); two in flight never change one surface of "
                            "one parent (evolve/search/specialists.py)")
    seed: int | None = knob(None, "the search's own draws (a random agent's choices, the population's parent "
                            "draws): null follows the run's first seed; another value explores differently on the "
                            "same training seeds")
    winner: str = knob("trained", "what the final comparison retrains. trained: the best validated of every "
                       "version trained, kept or discarded, as a sweep picks (the gate on 2 seeds discards real "
                       "gains; the final comparison's fresh seeds judge the pick); kept: the best validated the "
                       "gate kept", WINNERS)

    @property
    def restarts(self) -> bool:
        """Every version retrains from the base (restart) rather than from its parent's checkpoint."""
        return self.mode == "restart"


@dataclass(frozen=True)
class ApprovalConfig:
    at: tuple[str, ...] = knob((), "pause for `evotrainer approve/revise/abort RUN TRIAL` at these points",
                               APPROVAL_POINTS)
    after_failures: int = knob(0, "N > 0: after N failures in a row, pause at the next design too")


@dataclass(frozen=True)
class LLMConfig:
    base_url: str | None = knob(None, "null: the SDK's OPENAI_BASE_URL, else api.openai.com")
    model: str | None = knob(None, "null: $OPENAI_MODEL")
    api_key_env: str = knob("OPENAI_API_KEY", "the variable the key is read from (a local server needs none)")
    timeout_s: float = knob(120.0, "seconds for one request; past it the SDK retries with backoff")
    max_retries: int = knob(2, "retries of a request that failed or timed out (the SDK's own)")
    repair_turns: int = knob(2, "replies that fail to parse, apply or pass legality, sent back to fix")
    temperature: float = knob(0.2, "sampling temperature of the agent's replies, in [0, 2]")
    max_tokens: int = knob(4096, "the longest reply asked for, in tokens")
    token_limit: str = knob("max_tokens", "the request field max_tokens is sent as: max_tokens (vLLM, Ollama, "
                            "llama.cpp) or max_completion_tokens (OpenAI's reasoning models)", TOKEN_LIMITS)
    json_mode: bool = knob(True, "ask for response_format json_object (turn off for servers without it)")


@dataclass(frozen=True)
class CommandConfig:
    run: str | None = knob(None, "the agent's shell command line, e.g. \"my-agent --brief {brief}\": {brief}, "
                           "{worktree} and {proposal} in it are replaced by the brief file, the worktree and where "
                           "it may write its proposal; the brief also arrives on stdin")
    timeout_s: float = knob(900.0, "the agent's process group is killed past this many seconds")


@dataclass(frozen=True)
class RunConfig:
    task: str = knob(help="a task spec (evotrainer.catalog.get_task): arith, rg:FAMILY, "
                     "jsonl:PATH?verifier=exact|numeric|math, package.module:Factory, file.py:Factory, or an "
                     "`evotrainer.tasks` entry-point name")
    level: int | None = knob(None, "the task's target difficulty (arith: digits); null: the task's own (arith 3)")
    model: str | None = knob(None, "the policy: a Hugging Face causal LM (a directory, or a hub id already in the "
                             "local cache); null: the built-in tiny model, SFT'd as `base` says")
    backend: str = knob(_RUNTIME.backend, "who trains a segment: embedded, our GRPO trainer; trl, TRL's GRPOTrainer",
                        BACKEND_NAMES)
    dtype: str = knob(_POLICY.dtype, "autocast precision of the forward and backward passes (auto: bf16 on a CUDA "
                      "device that supports it, else fp32)", DTYPES)
    weights: str = knob(_POLICY.weights, "the dtype the weights (and AdamW's moments) are held in", WEIGHT_DTYPES)
    lora: dict | None = knob(None, "LoRA adapters instead of full fine-tuning (pip install 'evotrainer[peft]'): "
                             f"a mapping {{{_LORA_KEYS}}}, each key at that default where left out; each checkpoint "
                             "holds the adapter only, on the run's model (policy/adapters.py)")
    gradient_checkpointing: bool = knob(_RUNTIME.gradient_checkpointing, "recompute activations in the backward "
                                        "pass: less memory, more compute")
    data_parallel: int = knob(_RUNTIME.data_parallel, "training processes per segment (one per GPU; gloo on a CPU), "
                              "each a share of every step's prompts, gradients summed: the one-process update")
    device: str = knob(_POLICY.device, "auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps")
    chat_template: bool = knob(_POLICY.chat_template, "wrap prompts in the tokenizer's chat template when it has "
                               "one (off: plain text)")
    micro_batch_size: int = knob(_RUNTIME.micro_batch_size, "rollouts per forward/backward, gradients accumulated "
                                 "over the batch (0: all at once)")
    worker_memory_mb: int = knob(8192, "a training or evaluation worker is killed (oom) past this resident memory "
                                 "in MB (0: no limit)")
    sandbox: str = knob("auto", "isolation of every worker that runs untrusted code (evotrainer.sandbox): auto "
                        "(namespaces where the machine allows them, else process limits, said loudly in every "
                        "report), namespaces, limits, or none (opt out)", SANDBOXES)
    trl: TRLConfig = section(TRLConfig, "Read only with `backend: trl`")
    harness: str | None = knob(None, "root harness directory (null: the reference); a relative one is looked for "
                               "beside the config file first")
    seeds: tuple[int, ...] = knob((0, 1), "training seeds, paired across versions")
    final_seeds: tuple[int, ...] = knob((100, 101, 102, 103, 104), "fresh seeds of the final comparison (never "
                                        "used by the search); 5: a t interval over 3 has 2 df and misses most "
                                        "real gains")
    cache: str = knob("run", "trained segments and their scores, reused instead of training again "
                      "(evolve/segments/cache.py): run (RUN/cache, this run's own), off, or an absolute directory "
                      "that several runs or benchmark arms share")
    workers: int = knob(0, "training workers at once (0: one per core, at most one per job)")
    executor: str = knob("local", "where training and evaluation jobs run: local, a pool of `workers` on this "
                         "machine; ray, each job a Ray task, sandboxed on its node", EXECUTORS)
    ray: RayConfig = section(RayConfig, "Read only with `executor: ray` (pip install 'evotrainer[ray]'; see "
                             "scaling.md)")
    agent: str = knob("rules", "who proposes interventions: rules (offline, deterministic), random (the "
                      "baseline), llm or command", AGENTS)
    llm: LLMConfig = section(LLMConfig, "Read with `agent: llm`: any OpenAI-compatible chat endpoint, through the "
                             "official openai SDK (hosted OpenAI, vLLM, SGLang, Ollama, llama.cpp)")
    command: CommandConfig = section(CommandConfig, "Read with `agent: command`: an external coding agent, run in a "
                                     "worktree of the parent")
    approval: ApprovalConfig = section(ApprovalConfig, "A person in the loop (evolve/approval.py)")
    search: SearchConfig = section(SearchConfig, "How versions are proposed, kept and picked")
    base: BaseConfig = section(BaseConfig, "The built-in tiny model's SFT base (when no `model` is given)")
    budget: Budget = section(Budget, "What the search may spend")
    evaluation: EvalConfig = section(EvalConfig, "What the evaluator measures and when: the run's, never a "
                                     "harness's")
    promotion: PromotionConfig = section(PromotionConfig, "The promotion gate (evolve/stats/gate.py), a sequential test")
    tracking: TrackingConfig = section(TrackingConfig, "Experiment trackers, each an optional extra imported only "
                                       "when named")

    def validate(self) -> "RunConfig":
        def need(ok: bool, key: str, msg: str):
            if not ok:
                raise UsageError(f"config: '{key}' {msg}")
        need(bool(self.task), "task", "must name a task (arith, rg:FAMILY, jsonl:PATH, module:Factory, ...)")
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
        need(self.search.order in ORDERS, "search.order",
             f"must be one of {', '.join(ORDERS)}, got '{self.search.order}'")
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
        try:
            check_trackers(self.tracking.report_to)
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


def optional(hint) -> tuple[typing.Any, bool]:
    """A key's type without its None, and whether it may be null: `int | None` -> (int, True)."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        return next(a for a in args if a is not type(None)), True
    return hint, False


def _coerce(value, hint, key: str):
    if dataclasses.is_dataclass(hint):
        return config_from_dict(value, hint, f"{key}.")
    hint, nullable = optional(hint)
    if value is None and nullable:
        return None
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


def config_keys(cls=RunConfig, prefix: str = ""):
    """Every key of `cls` in order, a section followed by its own keys: (dotted key, field, type)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        yield f"{prefix}{f.name}", f, hints[f.name]
        if dataclasses.is_dataclass(hints[f.name]):
            yield from config_keys(hints[f.name], f"{prefix}{f.name}.")


def key_field(key: str) -> tuple[dataclasses.Field, typing.Any]:
    """The field of a dotted key (`evaluation.every`) and its type."""
    found = {k: (f, hint) for k, f, hint in config_keys()}
    if key not in found:
        raise KeyError(f"the run config has no key '{key}'")
    return found[key]


REFERENCE_HEAD = """\
# The run config

<!-- Generated from the fields of src/evotrainer/config.py by `python scripts/config_reference.py`:
edit those, not this page (tests/test_config_reference.py fails while the two differ). -->

A run config is the YAML file that `evotrainer run CONFIG --out RUN` reads. Only `task` is
required; every other key keeps the default below. A section is a mapping of its keys:

```yaml
task: arith
budget:
  trials: 4
```

Every key is checked: an unknown one, a wrong type or a negative budget is one line naming
the key and what is allowed, raised before anything runs. `evotrainer train` takes some of
these keys as flags (`evotrainer train --help`), with the same defaults.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _takes(hint, choices: tuple[str, ...]) -> str:
    """What a key accepts, in words: its names where it has them, else its type."""
    hint, nullable = optional(hint)
    names = [f"`{c}`" for c in choices]
    if typing.get_origin(hint) is tuple:
        kind = "integers" if typing.get_args(hint)[0] is int else "names"
        return f"a list of names among {', '.join(names)}" if names else f"a list of {kind}"
    words = names or {bool: ["true", "false"], int: ["an integer"], float: ["a number"], str: ["text"],
                      dict: ["a mapping"]}[hint]
    words = words + ["null"] * nullable
    return ", ".join(words[:-1]) + " or " + words[-1] if len(words) > 1 else words[0]


def _tables(cls, prefix: str = "") -> list[str]:
    """A table of `cls`'s keys, then a heading and table per section in it."""
    rows, sections = ["| key | default | takes | what it does |", "|---|---|---|---|"], []
    for f in dataclasses.fields(cls):
        hint = typing.get_type_hints(cls)[f.name]
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hint):
            sections += ["", f"## `{key}`", "", f"{f.metadata['help']}.", "", *_tables(hint, f"{key}.")]
            continue
        default = "required" if f.default is dataclasses.MISSING else f"`{shown(f.default)}`"
        rows.append(f"| `{key}` | {default} | {_cell(_takes(hint, f.metadata['choices']))} | "
                    f"{_cell(f.metadata['help'])} |")
    return rows + sections


def reference() -> str:
    """docs/config.md: every key with its default, what it takes and what it does, from the fields."""
    moved = [f"| `{old}` | read as `{new}`, with one line on stderr |" for old, new in MOVED.items()]
    moved += [f"| `{old}` | refused: {_cell(why)} |" for old, why in RENAMED.items()]
    return "\n".join([REFERENCE_HEAD, "## Top-level keys", "", *_tables(RunConfig), "", "## Keys that moved", "",
                      "A config written for an older evotrainer may use these names.", "",
                      "| key | now |", "|---|---|", *moved]) + "\n"

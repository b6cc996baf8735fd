"""Structured-config schemas for every config group, registered in Hydra's ConfigStore.

The main configs extend `base_config`, so a misspelt key or a value of the wrong type in
a YAML file or on the command line fails at composition with a message naming the key.
`validate` then checks ranges and cross-field rules before any compute starts.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, is_dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf


class ConfigError(ValueError):
    """A config value outside what is allowed; the message names the key."""


def project_root() -> Path:
    """STOPEXP_ROOT, else the checkout holding this package, else the working directory."""
    if os.environ.get("STOPEXP_ROOT"):
        return Path(os.environ["STOPEXP_ROOT"]).resolve()
    here = Path(__file__).resolve().parent.parent
    return here if (here / "pyproject.toml").exists() else Path.cwd()


if not OmegaConf.has_resolver("stopexp_root"):
    OmegaConf.register_new_resolver("stopexp_root", lambda: str(project_root()))


@dataclass
class ToyLMConfig:
    hidden_size: int = 96
    num_layers: int = 3
    num_heads: int = 4
    intermediate_size: int = 288
    batch_size: int = 64
    lr: float = 3e-3
    warmup_steps: int = 100
    max_steps: int = 6000
    eval_every: int = 200
    screen_prompts: int = 64
    screen_paths: int = 8
    target_accuracy: float = 0.5  # stop once per-path accuracy on screening prompts reaches it
    screen_temperature: float = 1.0
    screen_max_new_tokens: int = 64
    seed: int = 0


@dataclass
class ModelConfig:
    name: str = "toy"                 # recorded in every artifact
    path: Optional[str] = None        # hub id or local directory; None for the toy LM
    revision: Optional[str] = None
    dtype: str = "float32"            # float32 | bfloat16 | float16
    device: str = "auto"              # auto = cuda when present, else cpu
    attn_implementation: Optional[str] = None
    num_layers: Optional[int] = None  # known before loading, so tap layers are checked early
    hidden_size: Optional[int] = None
    # token budget per forward: rows x (prompt + max_new_tokens) stays within it, so long
    # prompts get fewer rows (with search.max_batch_rows, the smaller wins); None = no budget
    max_batch_tokens: Optional[int] = None
    chat_template: bool = True        # render prompts with the tokenizer's chat template, if any
    toy: Optional[ToyLMConfig] = None


@dataclass
class TaskConfig:
    name: str = "arith"
    n_steps: int = 6
    operators: List[str] = field(default_factory=lambda: ["+", "-", "*"])
    multipliers: List[int] = field(default_factory=lambda: [3, 7, 9])
    styles: Dict[str, float] = field(default_factory=lambda: {"careful": 0.5, "shortcut": 0.5})
    split_fractions: Dict[str, float] = field(
        default_factory=lambda: {"train": 0.8, "val": 0.1, "test": 0.1})
    seed: int = 0
    # qa (stopexp/tasks/qa.py): questions and reference answers from a file or hub dataset
    path: Optional[str] = None           # .jsonl / .json / .parquet file, or a hub dataset id
    subset: Optional[str] = None         # hub dataset config name (e.g. "main" for gsm8k)
    source_split: str = "test"           # which split of the hub dataset
    question_key: str = "question"
    answer_key: str = "answer"           # a bare answer or a solution ending in one
    answer_format: str = "numeric"       # numeric (#### 42, or \boxed{}) | boxed (\boxed{})
    prompt_template: str = "{question}"
    # wordprob (stopexp/tasks/wordprob.py): generated word problems with numeric answers
    steps: List[int] = field(default_factory=lambda: [1])   # steps per problem, drawn from this list
    number_range: List[int] = field(default_factory=lambda: [2, 9])  # [low, high] of the numbers
    operations: Dict[str, float] = field(default_factory=lambda: {
        "add": 1.0, "sub": 1.0, "compare": 1.0, "count": 0.0})  # first step's operation mix
    shots: int = 3                       # solved examples before the question
    format: str = "fewshot"              # fewshot (plain text) | chat (one user turn)
    extraction: str = "strict"           # strict ("The answer is N" / ####) | flexible (last number)
    instruction: str = ""                # chat format: text before the examples
    stop: List[str] = field(default_factory=list)  # the task's natural stop strings


@dataclass
class TapConfig:
    layers: List[int] = field(default_factory=lambda: [-1])
    pooling: str = "last"  # last | mean
    # prefix lengths in generated tokens; values below 1 are fractions of max_new_tokens
    checkpoints: List[float] = field(default_factory=lambda: [0.08, 0.25])


@dataclass
class PredictorConfig:
    name: str = "mlp"       # statistic | linear | mlp | fusion | conf_features | super_token
    hidden: int = 128
    depth: int = 1
    dropout: float = 0.0
    layer: int = -1         # which tap layer single-tap predictors read
    statistic: str = "l2"   # statistic predictor: l2 | mean | var
    n_tokens: int = 4       # super_token: [STOP] copies appended (one shared embedding)
    lora_rank: int = 8      # super_token: its LoRA adapter, active only on the [STOP] tokens
    lora_alpha: float = 16.0
    lora_targets: List[str] = field(default_factory=lambda: [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])


@dataclass
class LossConfig:
    name: str = "contrastive"  # contrastive | pairwise | reward_regression | mse
    margin: float = 1.0
    discount: float = 0.95     # mse: reward discounted by the tokens still to go
    length_reg: float = 0.0    # weight of the score<->prefix-length correlation penalty


@dataclass
class PolicyConfig:
    name: str = "topk"             # fixed | quantile | topk | adaptive
    keep: int = 8                  # topk: K paths kept out of N
    tau: float = 0.5               # fixed threshold (and the adaptive start)
    quantile: float = 0.5          # quantile: prune below this quantile of live signals
    target_prune_rate: float = 0.5
    gain: float = 0.1              # adaptive: step of the controller


@dataclass
class SearchConfig:
    name: str = "parallel"      # parallel (Launch-Check-Resume) | beam
    n_paths: int = 64           # N paths launched per prompt (parallel)
    beam_width: int = 4
    patience: int = 2           # beam: consecutive marks before a beam is pruned
    beam_checks: Optional[List[float]] = None  # beam: prefixes checked (like tap.checkpoints); None = every step
    check_at: float = 0.08      # prefix (one of tap.checkpoints) where parallel search checks
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    do_sample: bool = True
    conf_topk: int = 5
    group_window: int = 8       # DeepConf group-confidence window (tokens)
    max_batch_rows: int = 1024  # rows per forward; larger prompt sets run in chunks


@dataclass
class LoggerConfig:
    name: str = "wandb"        # wandb | none
    project: str = "stopexp"
    entity: Optional[str] = None
    mode: str = "offline"      # offline | online | disabled
    group: Optional[str] = None
    tags: List[str] = field(default_factory=list)


@dataclass
class CollectConfig:
    prompts: Dict[str, int] = field(
        default_factory=lambda: {"train": 200, "val": 50, "test": 200})
    mc_rollouts: int = 0
    keep_correct: Optional[List[int]] = None  # difficulty band [lo, hi] of correct paths
    keep_correct_splits: List[str] = field(default_factory=lambda: ["train", "val"])
    shard_prompts: int = 25
    seed: int = 0
    # this process's slice of the shards (shard index % world == rank); None = from the
    # RANK / WORLD_SIZE that torchrun or accelerate set, else 0 / 1
    rank: Optional[int] = None
    world: Optional[int] = None


@dataclass
class TrainConfig:
    epochs: int = 30
    batch_prompts: int = 16
    lr: float = 1e-3
    weight_decay: float = 0.01
    patience: int = 5
    checkpoint: float = 0.08  # which tap checkpoint the predictor is trained at
    seed: int = 0


@dataclass
class EvaluateConfig:
    mode: str = "replay"    # replay (from the trace bank) | online (runs the LM)
    split: str = "test"
    methods: List[str] = field(default_factory=lambda: [
        "no_prune", "random", "confidence", "min_logprob", "entropy", "deepconf", "hidden_norm",
        "conf_features", "learned", "oracle"])
    retention: List[int] = field(default_factory=lambda: [4, 8, 16])
    n_points: List[int] = field(default_factory=lambda: [8, 32, 64])
    bootstrap: int = 1000
    text_metrics: bool = True
    bertscore_model: Optional[str] = None  # None = the offline MiniLM encoder
    seed: int = 0


@dataclass
class PathsConfig:
    root: str = "${stopexp_root:}"
    output_dir: str = "${paths.root}/outputs"
    cache_dir: str = "${paths.output_dir}/cache"


@dataclass
class Config:
    stage: str = MISSING
    seed: int = 0
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    tap: TapConfig = field(default_factory=TapConfig)
    predictor: PredictorConfig = field(default_factory=PredictorConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    collect: CollectConfig = field(default_factory=CollectConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    optimized_metric: Optional[str] = None


def register() -> None:
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    for group, node in [("model", ModelConfig), ("task", TaskConfig), ("tap", TapConfig),
                        ("predictor", PredictorConfig), ("loss", LossConfig),
                        ("policy", PolicyConfig), ("search", SearchConfig),
                        ("logger", LoggerConfig)]:
        cs.store(group=group, name=f"{group}_schema", node=node)


register()

ALLOWED = {
    "model.dtype": ("float32", "bfloat16", "float16"),
    "task.name": ("arith", "qa", "wordprob"),
    "task.format": ("fewshot", "chat"),
    "task.extraction": ("strict", "flexible"),
    "task.answer_format": ("numeric", "boxed"),
    "tap.pooling": ("last", "mean"),
    "predictor.name": ("statistic", "linear", "mlp", "fusion", "conf_features", "super_token"),
    "predictor.statistic": ("l2", "mean", "var"),
    "loss.name": ("contrastive", "pairwise", "reward_regression", "mse"),
    "policy.name": ("fixed", "quantile", "topk", "adaptive"),
    "search.name": ("parallel", "beam"),
    "logger.name": ("wandb", "none"),
    "logger.mode": ("offline", "online", "disabled"),
    "evaluate.mode": ("replay", "online"),
}


def _get(cfg: Any, key: str) -> Any:
    return OmegaConf.select(cfg, key) if isinstance(cfg, DictConfig) else None


def checkpoint_tokens(value: float, max_new_tokens: int) -> int:
    """A checkpoint as a prefix length in tokens (values below 1 are fractions)."""
    return int(round(value * max_new_tokens)) if value < 1 else int(value)


def _unknown_keys(node: Any, prefix: str = "") -> list[str]:
    """Keys that no schema declares (`+key=value` can force them into a struct config)."""
    out = []
    if not isinstance(node, DictConfig):
        return out
    schema = OmegaConf.get_type(node)
    known = set(schema.__dataclass_fields__) if is_dataclass(schema) else None
    for key in node.keys():
        if key == "hydra":
            continue
        if known is not None and key not in known:
            out.append(f"{prefix}{key}")
        elif OmegaConf.is_dict(node._get_node(key)):
            out += _unknown_keys(node[key], f"{prefix}{key}.")
    return out


def validate(cfg: DictConfig) -> DictConfig:
    """Range and cross-field checks; raises ConfigError naming the key. Returns cfg."""
    def fail(key, msg):
        raise ConfigError(f"{key}: {msg}")

    unknown = _unknown_keys(cfg)
    if unknown:
        fail(unknown[0], "no such key in the config schema (stopexp/config.py); check the spelling")

    for key, allowed in ALLOWED.items():
        v = _get(cfg, key)
        if v is not None and v not in allowed:
            fail(key, f"{v!r} is not allowed; allowed: {', '.join(allowed)}")

    m, s, tap, pol = cfg.model, cfg.search, cfg.tap, cfg.policy
    if m.name == "toy" and m.toy is None:
        fail("model.toy", "the toy model needs its `toy:` section (see conf/model/toy.yaml)")
    if m.name != "toy" and not m.path:
        fail("model.path", f"model {m.name!r} needs a hub id or local directory")
    n_layers = m.toy.num_layers if m.toy is not None else m.num_layers
    if not tap.layers:
        fail("tap.layers", "give at least one layer")
    if n_layers is not None:
        for i in tap.layers:
            if not -n_layers <= i < n_layers:
                fail("tap.layers", f"layer {i} is outside the model's {n_layers} layers "
                                   f"(allowed {-n_layers}..{n_layers - 1})")
    if m.max_batch_tokens is not None and m.max_batch_tokens < s.n_paths * (s.max_new_tokens + 1):
        fail("model.max_batch_tokens", f"{m.max_batch_tokens} cannot hold one prompt's N paths: "
                                       f"needs >= N x (max_new_tokens + 1) = "
                                       f"{s.n_paths * (s.max_new_tokens + 1)} plus the prompt")
    if s.temperature <= 0:
        fail("search.temperature", f"must be > 0, got {s.temperature} (use do_sample=false for greedy)")
    if not 0 < s.top_p <= 1:
        fail("search.top_p", f"must lie in (0, 1], got {s.top_p}")
    if s.top_k < 0:
        fail("search.top_k", f"must be >= 0 (0 = off), got {s.top_k}")
    if s.max_new_tokens < 2:
        fail("search.max_new_tokens", f"must be >= 2, got {s.max_new_tokens}")
    if s.n_paths < 1:
        fail("search.n_paths", f"N must be >= 1, got {s.n_paths}")
    for name in ("beam_width", "patience", "conf_topk", "group_window", "max_batch_rows"):
        if s[name] < 1:
            fail(f"search.{name}", f"must be >= 1, got {s[name]}")
    ckpts = []
    for c in tap.checkpoints:
        if c <= 0 or (c >= 1 and c != int(c)):
            fail("tap.checkpoints", f"{c} is neither a fraction in (0, 1) nor a whole token count")
        t = checkpoint_tokens(c, s.max_new_tokens)
        if not 1 <= t < s.max_new_tokens:
            fail("tap.checkpoints", f"{c} is prefix {t}, beyond max length "
                                    f"{s.max_new_tokens} (search.max_new_tokens)")
        ckpts.append(t)
    for c in s.beam_checks or []:
        t = checkpoint_tokens(c, s.max_new_tokens) if c > 0 else 0
        if not 1 <= t < s.max_new_tokens or (c >= 1 and c != int(c)):
            fail("search.beam_checks", f"{c} is not a prefix in 1..{s.max_new_tokens - 1} "
                                       "tokens (or a fraction of search.max_new_tokens)")
    if checkpoint_tokens(s.check_at, s.max_new_tokens) not in ckpts:
        fail("search.check_at", f"{s.check_at} is not one of tap.checkpoints {list(tap.checkpoints)}")
    if checkpoint_tokens(cfg.train.checkpoint, s.max_new_tokens) not in ckpts:
        fail("train.checkpoint", f"{cfg.train.checkpoint} is not one of tap.checkpoints "
                                 f"{list(tap.checkpoints)}")
    if cfg.stage in ("evaluate", "pipeline"):  # what only evaluation uses
        if not 1 <= pol.keep <= s.n_paths:
            fail("policy.keep", f"retention K={pol.keep} must lie in 1..N={s.n_paths} (search.n_paths)")
        for k in cfg.evaluate.retention:
            if not 1 <= k <= s.n_paths:
                fail("evaluate.retention", f"K={k} must lie in 1..N={s.n_paths} (search.n_paths)")
        for n in cfg.evaluate.n_points:
            if not 1 <= n <= s.n_paths:
                fail("evaluate.n_points", f"N={n} must lie in 1..{s.n_paths} (search.n_paths)")
    pred = cfg.predictor
    if pred.n_tokens < 1 or pred.lora_rank < 1 or not pred.lora_targets:
        fail("predictor", f"super_token needs n_tokens >= 1, lora_rank >= 1 and lora_targets; got "
                          f"n_tokens={pred.n_tokens}, lora_rank={pred.lora_rank}, "
                          f"lora_targets={list(pred.lora_targets)}")
    if not 0 < pol.quantile < 1:
        fail("policy.quantile", f"must lie in (0, 1), got {pol.quantile}")
    if not 0 <= pol.target_prune_rate < 1:
        fail("policy.target_prune_rate", f"must lie in [0, 1), got {pol.target_prune_rate}")
    if cfg.collect.mc_rollouts < 0:
        fail("collect.mc_rollouts", f"K must be >= 0, got {cfg.collect.mc_rollouts}")
    for split, n in cfg.collect.prompts.items():
        if split not in cfg.task.split_fractions:
            fail("collect.prompts", f"split {split!r} unknown; allowed: "
                                    f"{', '.join(cfg.task.split_fractions)}")
        if n < 0:
            fail(f"collect.prompts.{split}", f"must be >= 0, got {n}")
    band = cfg.collect.keep_correct
    if band is not None and (len(band) != 2 or not 0 <= band[0] <= band[1] <= s.n_paths):
        fail("collect.keep_correct", f"needs [lo, hi] with 0 <= lo <= hi <= N={s.n_paths}, got {list(band)}")
    if cfg.collect.shard_prompts < 1:
        fail("collect.shard_prompts", f"must be >= 1, got {cfg.collect.shard_prompts}")
    rank, world = cfg.collect.rank, cfg.collect.world
    if world is not None and world < 1:
        fail("collect.world", f"must be >= 1, got {world}")
    if rank is not None and (rank < 0 or (world is not None and rank >= world)):
        fail("collect.rank", f"{rank} must lie in 0..collect.world-1 (world {world})")
    t = cfg.task
    if t.name == "qa" and not t.path:
        fail("task.path", "task qa needs a .jsonl / .json / .parquet file or a hub dataset id")
    if "{question}" not in t.prompt_template:
        fail("task.prompt_template", f"must contain {{question}}, got {t.prompt_template!r}")
    if t.n_steps < 1:
        fail("task.n_steps", f"must be >= 1, got {t.n_steps}")
    bad_ops = [o for o in t.operators if o not in ("+", "-", "*")]
    if bad_ops or not t.operators:
        fail("task.operators", f"{bad_ops or 'empty'}: allowed operators are +, -, *")
    bad_mult = [x for x in t.multipliers if x not in (1, 3, 7, 9)]
    if bad_mult or ("*" in t.operators and not t.multipliers):
        fail("task.multipliers", f"{bad_mult or 'empty'}: multipliers must be coprime to 10 "
                                 "(1, 3, 7, 9) so every step is a bijection")
    bad_styles = [k for k in t.styles if k not in ("careful", "shortcut")]
    if bad_styles or not t.styles or min(t.styles.values()) < 0 or sum(t.styles.values()) <= 0:
        fail("task.styles", "weights >= 0 for careful and/or shortcut, not all zero"
                            + (f"; unknown: {bad_styles}" if bad_styles else ""))
    fr = t.split_fractions
    if set(fr) != {"train", "val", "test"} or abs(sum(fr.values()) - 1) > 1e-6 or min(fr.values()) <= 0:
        fail("task.split_fractions", "needs train, val, test > 0 summing to 1")
    if cfg.train.epochs < 1 or cfg.train.batch_prompts < 1 or cfg.train.lr <= 0:
        fail("train", "epochs and batch_prompts must be >= 1 and lr > 0")
    if m.toy is not None and (m.toy.hidden_size % m.toy.num_heads):
        fail("model.toy.num_heads", f"hidden_size {m.toy.hidden_size} is not divisible by "
                                    f"{m.toy.num_heads} heads")
    return cfg

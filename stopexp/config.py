"""Structured-config schemas for every config group, registered in Hydra's ConfigStore.

The main configs extend `base_config`, so a misspelt key or a value of the wrong type in
a YAML file or on the command line fails at composition with a message naming the key.
`validate` then checks ranges and cross-field rules before any compute starts.
"""
from __future__ import annotations

import functools
import math
import os
import re
from dataclasses import dataclass, field, is_dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf, open_dict

from stopexp.core.errors import ConfigError


# Hydra's override grammar unescapes only quotes and backslashes before quotes, so
# `search.stop='["\n\nQuestion:"]'` arrives as a literal backslash-n. The text keys below
# decode `\n`, `\t`, `\r` and `\\` once, where the config is read (never in place, so
# reading a config twice cannot decode twice); any other backslash stays, as in `\boxed`.
TEXT_KEYS = ("stop", "prompt_template", "instruction")  # of the task; search.stop too
# sacrebleu's tokenizers that need no download (flores, spm) or extra package (mecab)
TEXT_TOKENIZERS = ("13a", "intl", "zh", "char")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}
_ESCAPE = re.compile(r"\\([ntr\\])")


def decode_escapes(text: str) -> str:
    r"""`text` with `\n`, `\t`, `\r` and `\\` (two characters each) decoded, left to right."""
    return _ESCAPE.sub(lambda m: _ESCAPES[m[1]], text)


def decoded_text(section: dict) -> dict:
    """A plain config section with its TEXT_KEYS decoded (`decode_escapes`)."""
    out = dict(section)
    for key in TEXT_KEYS:
        if isinstance(out.get(key), str):
            out[key] = decode_escapes(out[key])
        elif out.get(key) is not None:
            out[key] = [decode_escapes(x) if isinstance(x, str) else x for x in out[key]]
    return out


def stop_strings(task, search) -> tuple[str, ...]:
    """The stop strings a path ends at: the task's own (`task.stop`, where a new example
    would start) then `search.stop`, escapes decoded, each once."""
    return tuple(dict.fromkeys(map(decode_escapes, [*task.stop, *search.stop])))


def project_root() -> Path:
    """STOPEXP_ROOT, else the checkout holding this package, else the working directory."""
    if os.environ.get("STOPEXP_ROOT"):
        return Path(os.environ["STOPEXP_ROOT"]).resolve()
    here = Path(__file__).resolve().parent.parent
    return here if (here / "pyproject.toml").exists() else Path.cwd()


def model_name_of(path: Optional[str]) -> Optional[str]:
    """A model's display name from its hub id or directory: the last path component."""
    return Path(str(path).rstrip("/")).name if path else None


if not OmegaConf.has_resolver("stopexp_root"):
    OmegaConf.register_new_resolver("stopexp_root", lambda: str(project_root()))
if not OmegaConf.has_resolver("model_name_of"):
    OmegaConf.register_new_resolver("model_name_of", model_name_of)


# Defaults that only make sense relative to N = search.n_paths are derived from it, so a
# run shrunk to search.n_paths=8 needs no other edit: K = round(sqrt(N)) (8 of 64, 4 of 16,
# 3 of 8), the retentions K/2, K, 2K and the Pareto Ns K, N/2, N (within 1..N).
def derived_keep(n_paths: int, check_at: Any = None, policy: str = "topk") -> Any:
    """policy.keep's default: K = round(sqrt(N)); with several checks under policy=topk one
    K per check, doubling backwards from the last (64 paths, 2 checks: [16, 8])."""
    k = max(1, round(math.sqrt(n_paths)))
    checks = check_values(check_at) if check_at is not None else [None]
    if policy != "topk" or len(checks) == 1:
        return k
    return [min(n_paths, k * 2 ** (len(checks) - 1 - i)) for i in range(len(checks))]


def derived_retention(n_paths: int) -> list[int]:
    """evaluate.retention's default: K/2, K, 2K for K = round(sqrt(N)), within 1..N."""
    k = derived_keep(n_paths)
    return sorted({max(1, k // 2), k, min(n_paths, 2 * k)})


def derived_n_points(n_paths: int) -> list[int]:
    """evaluate.n_points's default: K = round(sqrt(N)), N // 2 and N, within 1..N."""
    return sorted({derived_keep(n_paths), max(1, n_paths // 2), n_paths})


for _name, _fn in (("stopexp_keep", derived_keep), ("stopexp_retention", derived_retention),
                   ("stopexp_n_points", derived_n_points)):
    if not OmegaConf.has_resolver(_name):
        OmegaConf.register_new_resolver(_name, _fn)
import stopexp.runtime.run_id  # noqa: E402,F401  (registers ${stopexp_run_id:} for the run dirs)


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
    # arith task keys the LM learns where they differ from `task` (a distribution shift:
    # prompts from `task`, the LM trained on these); empty = the studied task
    train_task: Dict[str, Any] = field(default_factory=dict)


@dataclass
class ModelConfig:
    name: Optional[str] = "toy"       # recorded in every artifact (hub models: from the path)
    path: Optional[str] = None        # hub id or local directory; None for the toy LM
    # a GGUF checkpoint (a file path, or PACKAGE:FILE for a file shipped in an installed
    # Python package), converted once into a plain HF directory in the cache; excludes `path`
    gguf_file: Optional[str] = None
    revision: Optional[str] = None
    # auto = float32 on a CPU, bfloat16 on a GPU that supports it (else float16)
    dtype: str = "auto"               # auto | float32 | bfloat16 | float16
    device: str = "auto"              # auto = cuda when present, else cpu
    attn_implementation: Optional[str] = None
    # None = read from the loaded model; set them to check tap layers before loading
    num_layers: Optional[int] = None
    hidden_size: Optional[int] = None
    # longest prompt in tokens; None = the model's max_position_embeddings - max_new_tokens
    max_prompt_tokens: Optional[int] = None
    long_prompts: str = "error"       # error (names the prompt) | skip (drops it, logs a count)
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
    # strict (#### / "The answer is" / \boxed{}) | flexible (else the last number); every task
    extraction: str = "strict"
    prompt_template: str = "{question}"
    # wordprob (stopexp/tasks/wordprob.py): generated word problems with numeric answers
    steps: List[int] = field(default_factory=lambda: [1])   # steps per problem, drawn from this list
    number_range: List[int] = field(default_factory=lambda: [2, 9])  # [low, high] of the numbers
    operations: Dict[str, float] = field(default_factory=lambda: {
        "add": 1.0, "sub": 1.0, "compare": 1.0, "count": 0.0})  # first step's operation mix
    shots: int = 3                       # solved examples before the question
    format: str = "fewshot"              # fewshot (plain text) | chat (one user turn)
    instruction: str = ""                # chat format: text before the examples
    stop: List[str] = field(default_factory=list)  # the task's natural stop strings
    # how BLEU / ROUGE (metrics and rewards) split a word-level task's text into words:
    # 13a (scripts with spaces: Latin, Cyrillic, ...) | intl | zh (Chinese) | char
    tokenize: str = "13a"


@dataclass
class TapPositionsConfig:
    # Where features are extracted (stopexp.store.features), in generated tokens: always
    # tap.checkpoints, plus these checkpoints (fractions of max_new_tokens or token counts),
    # every `stride` tokens, and with `step_ends` every token that ends a reasoning step
    # (the task's step separator: ";" in arith, a newline in text tasks).
    checkpoints: List[float] = field(default_factory=list)
    stride: Optional[int] = None
    step_ends: bool = False
    dtype: str = "float32"  # float32 | float16 (half the bytes)


@dataclass
class TapConfig:
    # decoder layer indices (negative count from the end) or "first" | "mid" | "last",
    # resolved against the loaded model (mid = num_layers // 2)
    layers: List[Any] = field(default_factory=lambda: [-1])
    pooling: str = "last"  # last | mean
    # prefix lengths in generated tokens; values below 1 are fractions of max_new_tokens
    checkpoints: List[float] = field(default_factory=lambda: [0.08, 0.25])
    # attention entropy (signal attn_entropy): None = off; "all" = every head of the tapped
    # layers; or a list of "layer:head" (layer as in tap.layers). Forces eager attention.
    attention_heads: Any = None
    positions: TapPositionsConfig = field(default_factory=TapPositionsConfig)


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
    # conf_features: signal columns read besides the confidence ones (e.g. [attn_entropy])
    signals: List[str] = field(default_factory=list)
    # linear | mlp | fusion: the position (generated tokens) as one more input of the head,
    # log-scaled (stopexp.signals.features.position_feature)
    position_input: bool = False


@dataclass
class LossConfig:
    name: str = "contrastive"  # contrastive | pairwise | reward_regression | mse
    # contrastive: relu(margin * reward gap - score gap) over pairs ordered by reward (a
    # 0/1 outcome has gap 1: the plain margin)
    margin: float = 1.0
    min_gap: float = 0.0       # contrastive / pairwise: pairs whose reward gap is <= this are skipped
    discount: float = 0.95     # mse: reward discounted by the tokens still to go
    length_reg: float = 0.0    # weight of the score<->prefix-length correlation penalty


@dataclass
class PolicyConfig:
    name: str = "topk"             # fixed | quantile | topk | adaptive
    # topk: K paths kept out of N (a list: one K per search.check_at); default derived from
    # search.n_paths: round(sqrt(N)), and with several checks one K per check (derived_keep)
    keep: Any = "${stopexp_keep:${search.n_paths},${search.check_at},${policy.name}}"
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
    refill: bool = True         # beam: a pruned beam's slot goes to the next best candidate; false = the beam narrows
    # parallel: the prefix where Launch-Check-Resume checks (one of tap.checkpoints), or a
    # list of them (progressive: policy=topk then takes one decreasing K per check in policy.keep)
    check_at: Any = 0.08
    score_rule: str = "last"    # parallel, several checks: last | running_mean (STEP, arXiv 2601.09093)
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    do_sample: bool = True
    conf_topk: int = 5
    group_window: int = 8       # DeepConf group-confidence window (tokens)
    max_batch_rows: int = 1024  # rows per forward; larger prompt sets run in chunks
    # stop strings: a path ends at the token that completes one (kept, as in HF
    # generate(stop_strings=...)); nothing after it is generated or counted
    stop: List[str] = field(default_factory=list)


@dataclass
class RewardConfig:
    """A path's reward (stopexp/tasks/rewards.py): stored in the bank beside its outcome, the
    label of the losses and the target of Monte Carlo rollouts (their mean reward)."""
    name: str = "correct"   # correct | rouge_l | bleu | bertscore | neg_perplexity | external
    function: Optional[str] = None        # external: a registered name or "module:function"
    bertscore_model: Optional[str] = None  # bertscore: None = the bundled offline MiniLM


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
    # checkpoint: at train.checkpoint only | all: at every stored position, pairs mined
    # within (prompt, position), a batch holds batch_prompts such groups, epochs selected
    # on the validation within-prompt AUROC averaged over positions (stopexp/training/per_step.py)
    positions: str = "checkpoint"
    seed: int = 0


@dataclass
class EvaluateConfig:
    mode: str = "replay"    # replay (from the trace bank) | online (runs the LM)
    split: str = "test"
    # what runs, plus no_prune, random, confidence and oracle, which always do (ALWAYS_METHODS:
    # [] runs just those four); `learned` = the configured predictor (predictor.name)
    methods: List[str] = field(default_factory=lambda: [
        "no_prune", "random", "confidence", "min_logprob", "entropy", "deepconf", "hidden_norm",
        "hidden_mean", "hidden_var", "st_bon", "conf_features", "learned", "oracle", "esc", "adaptive_consistency",
        "deepconf_online", "deepconf_weighted", "deepconf_top"])
    # the Pareto points: every K of `retention` at N = search.n_paths, no_prune at every N
    # of `n_points`; derived from search.n_paths (derived_retention, derived_n_points)
    retention: List[int] = "${stopexp_retention:${search.n_paths}}"  # type: ignore[assignment]
    n_points: List[int] = "${stopexp_n_points:${search.n_paths}}"  # type: ignore[assignment]
    bootstrap: int = 1000
    text_metrics: bool = True
    # the final output of a prompt: vote (majority over the kept paths' answers), or for
    # tasks without a single answer the kept path with the best signal (the method's score
    # at the check), the best LM score (mean token log-prob) or, as an oracle, the best reward
    select: str = "vote"            # vote | signal | lm_score | oracle
    compare_beam: bool = False      # also run plain beam search (no pruning) and compare outputs
    bertscore_model: Optional[str] = None  # None = the offline MiniLM encoder
    seed: int = 0
    esc_window: int = 8             # ESC: paths sampled per window
    asc_threshold: float = 0.95     # Adaptive-Consistency: posterior the leader is the majority
    deepconf_warmup: float = 0.25   # DeepConf online: warm-up paths per prompt (below 1: share of N)
    deepconf_keep_percent: float = 10.0  # DeepConf: threshold percentile 100 - this; top-share vote
    vote: str = "majority"          # majority | weighted (by the final signal) | filtered (stopexp.core.voting)
    vote_top: float = 0.5           # filtered: share of the scored kept paths that vote


@dataclass
class AdaptConfig:
    """Online fine-tuning from pruning feedback under a distribution shift (stopexp/stages/adapt.py)."""
    # the shift: dotted config keys (under task, model or search) and the values the
    # stream's config takes, e.g. {task.operators: [+, -]}; empty = no shift
    target: Dict[str, Any] = field(default_factory=dict)
    # toy LM: the target bank is made by the source task's LM (true), or by the LM trained
    # on the target task (false: the LM shifts too, e.g. for another task.styles mix)
    pin_lm: bool = True
    split: str = "test"             # the target bank's split the stream and held-out prompts come from
    stream_prompts: int = 150       # prompts in the stream, in a seeded order
    heldout_prompts: int = 50       # further prompts of that split, scored after every update
    batch_prompts: int = 10         # prompts pruned between two updates
    steps: int = 5                  # gradient steps per update (the train losses)
    lr: float = 1e-3
    weight_decay: float = 0.01
    buffer: int = 4                 # earlier batches of feedback replayed at each update
    explore: float = 0.1            # chance a would-be-pruned live path is finished anyway
    importance_weight: bool = True  # weight explored (and Monte Carlo) feedback by 1 / its chance
    # mc_feedback: pruned prefixes per batch (drawn at random) continued mc_rollouts times
    # from the check; their success rate is their soft label (replay: the bank's `mc`)
    mc_prefixes: int = 20
    mc_rollouts: int = 4
    variants: List[str] = field(default_factory=lambda: [
        "no_prune", "frozen", "kept_only", "explore", "retrained"])
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
    reward: RewardConfig = field(default_factory=RewardConfig)
    collect: CollectConfig = field(default_factory=CollectConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    adapt: AdaptConfig = field(default_factory=AdaptConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    optimized_metric: Optional[str] = None


def register() -> None:
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    for group, node in [("model", ModelConfig), ("task", TaskConfig), ("tap", TapConfig),
                        ("predictor", PredictorConfig), ("loss", LossConfig),
                        ("policy", PolicyConfig), ("search", SearchConfig),
                        ("logger", LoggerConfig), ("reward", RewardConfig)]:
        cs.store(group=group, name=f"{group}_schema", node=node)


register()

ALLOWED = {
    "model.dtype": ("auto", "float32", "bfloat16", "float16"),
    "model.long_prompts": ("error", "skip"),
    "task.name": ("arith", "qa", "wordprob", "datatotext"),
    "task.format": ("fewshot", "chat"),
    "task.answer_format": ("numeric", "boxed"),
    "task.extraction": ("strict", "flexible"),
    "task.tokenize": TEXT_TOKENIZERS,
    "tap.pooling": ("last", "mean"),
    "tap.positions.dtype": ("float32", "float16"),
    "predictor.name": ("statistic", "linear", "mlp", "fusion", "conf_features", "super_token"),
    "predictor.statistic": ("l2", "mean", "var"),
    "loss.name": ("contrastive", "pairwise", "reward_regression", "mse"),
    "train.positions": ("checkpoint", "all"),
    "policy.name": ("fixed", "quantile", "topk", "adaptive"),
    "search.name": ("parallel", "beam"),
    "logger.name": ("wandb", "none"),
    "logger.mode": ("offline", "online", "disabled"),
    "evaluate.mode": ("replay", "online"),
    "evaluate.vote": ("majority", "weighted", "filtered"),
    "search.score_rule": ("last", "running_mean"),
    "evaluate.select": ("vote", "signal", "lm_score", "oracle"),
    "reward.name": ("correct", "rouge_l", "bleu", "bertscore", "neg_perplexity", "external"),
}
# Keys that only some options read: key -> (the key naming the option, the options that
# read it; for evaluate.methods, the methods). Under another option the run would ignore
# the key, so validate refuses any value but the schema default (`_check_unread`). An exp
# sets such a key as ${stopexp_where_read:KEY,VALUE}: VALUE where it is read, else the
# default, so that replacing the exp's option (+exp=toy_datatotext loss=mse) just works.
# Not here: the policy knobs (a policy sweep sets every policy's budget at once, as
# conf/hparams_search/optuna_toy.yaml does) and search.beam_width (evaluate.compare_beam
# reads it under search=parallel).
_ARITH, _QA, _WORDPROB = ("arith",), ("qa",), ("wordprob",)
READ_ONLY_BY = {
    "loss.margin": ("loss.name", ("contrastive",)),
    "loss.min_gap": ("loss.name", ("contrastive", "pairwise")),
    "loss.discount": ("loss.name", ("mse",)),
    "search.patience": ("search.name", ("beam",)),
    "predictor.statistic": ("predictor.name", ("statistic",)),
    **{f"predictor.{k}": ("predictor.name", ("super_token",))
       for k in ("n_tokens", "lora_rank", "lora_alpha", "lora_targets")},
    # what stopexp.tasks.build_task passes to each task
    **{f"task.{k}": ("task.name", _ARITH) for k in ("n_steps", "operators", "multipliers", "styles")},
    **{f"task.{k}": ("task.name", _QA) for k in ("path", "subset", "source_split", "question_key",
                                                "answer_key", "answer_format", "prompt_template")},
    **{f"task.{k}": ("task.name", _WORDPROB) for k in ("steps", "number_range", "operations")},
    **{f"task.{k}": ("task.name", ("wordprob", "datatotext")) for k in ("shots", "format",
                                                                        "instruction")},
    "task.extraction": ("task.name", ("qa", "wordprob")),
    "task.tokenize": ("task.name", ("qa", "wordprob", "datatotext")),  # arith compares characters
    "evaluate.esc_window": ("evaluate.methods", ("esc",)),
    "evaluate.asc_threshold": ("evaluate.methods", ("adaptive_consistency",)),
    "evaluate.deepconf_warmup": ("evaluate.methods", ("deepconf_online",)),
    "evaluate.deepconf_keep_percent": ("evaluate.methods", ("deepconf_online", "deepconf_top")),
}
# model.* keys the embedded toy LM (model=toy) never reads: it loads from its own
# directory, sized by model.toy
TOY_UNREAD = ("path", "gguf_file", "revision", "num_layers", "hidden_size")


@functools.lru_cache(maxsize=1)
def _schema() -> DictConfig:
    """The schema's defaults, built once (building them takes ~50 ms); read-only."""
    schema = OmegaConf.structured(Config)
    OmegaConf.set_readonly(schema, True)
    return schema


def _schema_default(key: str) -> Any:
    return OmegaConf.select(_schema(), key)


def _reads(cfg, key: str) -> bool:
    option_key, readers = READ_ONLY_BY[key]
    option = OmegaConf.select(cfg, option_key)
    return bool(set(option) & set(readers)) if _is_list(option) else option in readers


def where_read(key: str, value: Any, *, _root_) -> Any:
    """${stopexp_where_read:KEY,VALUE} in an exp: VALUE where the chosen option reads KEY
    (READ_ONLY_BY), else the schema default."""
    return value if _reads(_root_, key) else _schema_default(key)


if not OmegaConf.has_resolver("stopexp_where_read"):
    OmegaConf.register_new_resolver("stopexp_where_read", where_read)


def _check_unread(cfg) -> None:
    """Every READ_ONLY_BY key that the chosen option does not read is at its default."""
    for key, (option_key, readers) in READ_ONLY_BY.items():
        value, default = OmegaConf.select(cfg, key), _schema_default(key)
        if value != default and not _reads(cfg, key):
            group = option_key.split(".")[-1] if option_key == "evaluate.methods" else option_key.split(".")[0]
            chosen = (f"evaluate.methods without {' or '.join(readers)}" if option_key == "evaluate.methods"
                      else f"{group}={OmegaConf.select(cfg, option_key)}")
            readers_text = (f"the method {' or '.join(readers)}" if option_key == "evaluate.methods"
                            else f"{group}={'|'.join(readers)}")
            shown = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
            _fail(key, f"{shown!r} is read only by {readers_text}, not under {chosen}; leave it "
                       f"unset (default {default!r})")


SYMBOLIC_LAYERS = ("first", "mid", "last")
SEED_KEYS = ("seed", "task.seed", "collect.seed", "train.seed", "evaluate.seed", "model.toy.seed",
             "adapt.seed")
ADAPT_VARIANTS = ("no_prune", "frozen", "kept_only", "explore", "mc_feedback", "retrained")
DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")
SPLITS = ("train", "val", "test")
# The smallest sampling temperature. Logits are divided by it in float32: at 1e-38 a logit
# of 10 overflows to inf and the log-probs turn NaN. At 1e-4 a logit of 1e4 stays far
# inside float32, and a logit gap of 1e-3 is already 10 nats, i.e. sampling is greedy
# for all purposes: below it, use search.do_sample=false.
MIN_TEMPERATURE = 1e-4
# the methods evaluate always runs (evaluate.ALWAYS) and the non-learnable baselines
# (stopexp.signals.methods.NON_LEARNABLE), kept here so that checking a method name needs
# no torch import
ALWAYS_METHODS = ("no_prune", "random", "confidence", "oracle")
BASELINE_METHODS = ("confidence", "min_logprob", "entropy", "deepconf", "hidden_norm",
                    "hidden_mean", "hidden_var", "attn_entropy", "st_bon")
# methods with their own stopping protocol (stopexp/stopping/replay.py), not a score at the check
STOPPING_METHODS = ("esc", "adaptive_consistency", "deepconf_online", "deepconf_weighted",
                    "deepconf_top")


# the end of a message about a value relative to N that the user set
_TOGETHER = ("; change it with search.n_paths, or leave {key} unset: it is derived from "
             "search.n_paths (stopexp.config.derived_*)")


def _get(cfg: Any, key: str) -> Any:
    return OmegaConf.select(cfg, key) if isinstance(cfg, DictConfig) else None


def warmup_paths(value: float, n_paths: int) -> int:
    """DeepConf's warm-up paths per prompt: a count, or below 1 a share of n_paths (rounded,
    and at least one path, so that a share works at any N >= 2)."""
    if value >= 1:
        return int(value)
    return max(1, int(round(value * n_paths))) if value > 0 else 0


def checkpoint_tokens(value: float, max_new_tokens: int) -> int:
    """A checkpoint as a prefix length in tokens (values below 1 are fractions)."""
    return int(round(value * max_new_tokens)) if value < 1 else int(value)


def _is_list(value) -> bool:
    return isinstance(value, (list, tuple, ListConfig))


def check_values(value) -> list:
    """search.check_at (or policy.keep) as a list: one value, or the list given."""
    return list(value) if _is_list(value) else [value]


def check_plan(cfg) -> list[tuple[int, int]]:
    """Launch-Check-Resume's checks in order, as (prefix tokens, K kept): search.check_at
    (one prefix, or a list of them: progressive) and policy.keep (a list of one K per
    check, decreasing, under policy=topk; a single K is repeated, which validate allows
    only where K is not read: the threshold policies). `validate` has checked both."""
    s = cfg.search
    checks = check_values(s.check_at)
    keeps = check_values(cfg.policy.keep)
    keeps = keeps * len(checks) if len(keeps) == 1 else keeps
    return [(checkpoint_tokens(c, s.max_new_tokens), int(k)) for c, k in zip(checks, keeps)]


def layer_index(entry: int | str, n_layers: int) -> int:
    """A tap layer entry (an index, negative from the end, or first | mid | last) as a
    layer index in 0..n_layers-1; mid is n_layers // 2. ValueError names tap.layers."""
    if isinstance(entry, str):
        if entry not in SYMBOLIC_LAYERS:
            raise ValueError(f"tap.layers: {entry!r} is not a layer; give an index or one of "
                             f"{', '.join(SYMBOLIC_LAYERS)}")
        return {"first": 0, "mid": n_layers // 2, "last": n_layers - 1}[entry]
    if not -n_layers <= entry < n_layers:
        raise ValueError(f"tap.layers: layer {entry} is outside the model's {n_layers} layers "
                         f"(allowed {-n_layers}..{n_layers - 1}, or {', '.join(SYMBOLIC_LAYERS)})")
    return entry % n_layers


def attention_heads(entries, tap_layers, n_layers: int | None,
                    n_heads: int | None) -> list[tuple[int, int]]:
    """tap.attention_heads as distinct (layer, head) pairs, sorted: "all" is every head of
    the `tap_layers`; a list holds "layer:head" strings (layer: an index, negative from the
    end, or first | mid | last). [] when off (None). ConfigError names tap.attention_heads
    and what is allowed; layers and heads are checked (and resolved) only when `n_layers`
    and `n_heads` are known: before that, only the format."""
    entries = list(entries) if OmegaConf.is_list(entries) else entries
    if entries is None:
        return []
    if entries == "all":
        if n_layers is None or n_heads is None:
            return []
        return [(layer, h) for layer in resolve_layers(tap_layers, n_layers) for h in range(n_heads)]
    if isinstance(entries, str) or not entries:
        _fail("tap.attention_heads", f"{entries!r}: give all or a non-empty list of layer:head "
                                     "(e.g. [0:1,last:0])")
    pairs = set()
    for e in entries:
        layer, _, head = str(e).partition(":")
        layer = layer.strip()
        if not head.strip().isdigit() or not (layer in SYMBOLIC_LAYERS or re.fullmatch(r"-?\d+", layer)):
            _fail("tap.attention_heads", f"{e!r} is not layer:head; allowed: all, or entries like "
                                         f"0:1, -1:3, last:0 (layer: an index or {', '.join(SYMBOLIC_LAYERS)}; "
                                         "quote them in YAML, where 0:1 reads as a number)")
        if n_layers is None:
            continue
        try:
            index = layer_index(layer if layer in SYMBOLIC_LAYERS else int(layer), n_layers)
        except ValueError as err:
            _fail("tap.attention_heads", f"{e!r}: {str(err).removeprefix('tap.layers: ')}")
        if n_heads is not None and not int(head) < n_heads:
            _fail("tap.attention_heads", f"{e!r}: head {int(head)} is outside the model's "
                                         f"{n_heads} heads (allowed 0..{n_heads - 1})")
        pairs.add((index, int(head)))
    return sorted(pairs)


def resolve_layers(layers, n_layers: int) -> list[int]:
    """Tap layer entries as distinct layer indices, shallowest first, so the last one is
    always the deepest tapped layer (the one `hidden_norm` reads)."""
    return sorted({layer_index(e, n_layers) for e in layers})


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


def _nonfinite(node: Any, key: str) -> Optional[tuple[str, float]]:
    """The first float in `node` (a plain container) that is NaN or infinite: (key, value)."""
    if isinstance(node, float) and not math.isfinite(node):
        return key, node
    if isinstance(node, dict):
        items = ((f"{key}.{k}", v) for k, v in node.items())
    elif isinstance(node, (list, tuple)):
        items = ((key, v) for v in node)  # a list entry is named by the list's key
    else:
        return None
    for sub_key, value in items:
        found = _nonfinite(value, sub_key)
        if found:
            return found
    return None


def _fail(key: str, msg: str):
    raise ConfigError(f"{key}: {msg}")


def _at_least(key: str, value, low) -> None:
    """value >= low (written so that NaN fails)."""
    if value is None or not value >= low:
        _fail(key, f"must be >= {low}, got {value}")


def _within(key: str, value, low, high, low_open=False, high_open=False) -> None:
    """low <= value <= high, either end open; NaN fails."""
    ok = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        _fail(key, f"must lie in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}, "
                   f"got {value}")


def validate(cfg: DictConfig) -> DictConfig:
    """Every check that needs no compute, for the stages that `cfg.stage` will run: unknown
    keys, allowed names, finite floats (NaN and inf are refused everywhere), the range of
    every numeric key and the cross-field rules. Raises ConfigError naming the key; returns cfg."""
    unknown = _unknown_keys(cfg)
    if unknown:
        _fail(unknown[0], "no such key in the config schema (stopexp/config.py); check the spelling")
    for key, allowed in ALLOWED.items():
        v = _get(cfg, key)
        if v is not None and v not in allowed:
            _fail(key, f"{v!r} is not allowed; allowed: {', '.join(allowed)}")
    for key in cfg:
        if key != "hydra":
            node = cfg[key]
            found = _nonfinite(OmegaConf.to_container(node, resolve=True)
                               if OmegaConf.is_config(node) else node, str(key))
            if found:
                _fail(found[0], f"{found[1]} is not a finite number")
    for key in SEED_KEYS:  # numpy's generators refuse negative seeds
        if _get(cfg, key) is not None:
            _at_least(key, _get(cfg, key), 0)
    _check_model(cfg)
    _check_task(cfg.task)
    _check_search_and_taps(cfg)
    _check_collect(cfg)
    _check_predictor_loss_train(cfg)
    _check_reward(cfg)
    _check_unread(cfg)  # after the range checks: a bad value is named as such first
    if cfg.stage in ("train", "pipeline", "adapt"):  # adapt trains the source and target predictors
        for split in ("train", "val"):  # training fits on train and selects the epoch on val
            if not cfg.collect.prompts.get(split, 0) > 0:
                _fail(f"collect.prompts.{split}", f"train needs {split} prompts in the trace bank, "
                                                  f"got {cfg.collect.prompts.get(split, 0)}")
    if cfg.stage in ("evaluate", "pipeline"):
        _check_evaluate(cfg)
    if cfg.stage == "adapt":
        _check_adapt(cfg)
    return cfg


# what adapt.target may change (collect.mc_rollouts: Monte Carlo labels in the target bank only)
SHIFTABLE = ("task.", "model.", "search.", "collect.mc_rollouts")


def shifted_config(cfg) -> DictConfig:
    """A copy of `cfg` with every `adapt.target` key set to its value and the target
    emptied (the config of the stream's bank)."""
    import copy

    out = copy.deepcopy(cfg)
    with open_dict(out):
        for key, value in cfg.adapt.target.items():
            OmegaConf.update(out, str(key), value, merge=False, force_add=False)
        out.adapt.target = {}
    return out


def _check_adapt(cfg) -> None:
    a, s = cfg.adapt, cfg.search
    ev = cfg.evaluate
    for key, value, default in (("evaluate.vote", ev.vote, "majority"),
                                ("evaluate.select", ev.select, "vote"),
                                ("evaluate.compare_beam", ev.compare_beam, False)):
        if value != default:
            _fail(key, f"{value!r} is not used: adapt scores every variant by the majority vote "
                       f"of its finishing paths; leave it {default}")
    missing = object()
    bad = [k for k in a.target if not str(k).startswith(SHIFTABLE)
           or OmegaConf.select(cfg, str(k), default=missing) is missing]
    if bad:
        _fail("adapt.target", f"{bad} are not config keys under {', '.join(SHIFTABLE)} "
                              "(give dotted keys, e.g. {task.n_steps: 8})")
    _check_mc_feedback(cfg)
    if a.split not in SPLITS:
        _fail("adapt.split", f"{a.split!r} unknown; allowed: {', '.join(SPLITS)}")
    for key in ("stream_prompts", "batch_prompts"):
        _at_least(f"adapt.{key}", a[key], 1)
    for key in ("heldout_prompts", "steps", "buffer"):
        _at_least(f"adapt.{key}", a[key], 0)
    have = cfg.collect.prompts.get(a.split, 0)
    if a.stream_prompts + a.heldout_prompts > have:
        _fail("adapt.stream_prompts", f"{a.stream_prompts} streamed + {a.heldout_prompts} held out "
                                      f"(adapt.heldout_prompts) exceed the {have} {a.split} prompts "
                                      f"of the bank (collect.prompts.{a.split})")
    _within("adapt.lr", a.lr, 0, math.inf, low_open=True, high_open=True)
    _at_least("adapt.weight_decay", a.weight_decay, 0)
    _within("adapt.explore", a.explore, 0, 1)
    bad = [v for v in a.variants if v not in ADAPT_VARIANTS]
    if bad or not a.variants:
        _fail("adapt.variants", f"{bad or 'empty'}: allowed: {', '.join(ADAPT_VARIANTS)}")
    if "explore" in a.variants and not a.explore > 0:
        _fail("adapt.explore", "the explore variant needs a share in (0, 1], got 0 (or drop it "
                               "from adapt.variants)")
    if not 1 <= cfg.policy.keep <= s.n_paths:
        _fail("policy.keep", f"retention K={cfg.policy.keep} must lie in 1..N={s.n_paths} "
                             f"(search.n_paths){_TOGETHER.format(key='policy.keep')}")
    if s.name != "parallel":
        _fail("search.name", f"adapt prunes with Launch-Check-Resume (search=parallel), not {s.name!r}")
    if cfg.predictor.name == "super_token":
        _fail("predictor.name", "adapt updates feature predictors (statistic, linear, mlp, fusion, "
                                "conf_features); super_token would need the LM in the loop")
    # last, once the source config has passed: an error now comes from the target's values
    try:
        if a.target:  # the stream's config passes every check too (its target is empty)
            validate(shifted_config(cfg))
    except (ConfigError, ValueError) as e:
        raise ConfigError(f"adapt.target: {e}") from None


def _check_mc_feedback(cfg) -> None:
    """adapt.mc_prefixes / mc_rollouts; in replay the continuations are the target bank's
    Monte Carlo labels, so that bank must have them, from as many rollouts."""
    a = cfg.adapt
    for key in ("mc_prefixes", "mc_rollouts"):
        _at_least(f"adapt.{key}", a[key], 1 if "mc_feedback" in a.variants else 0)
    if "mc_feedback" not in a.variants or cfg.evaluate.mode != "replay":
        return
    have = shifted_config(cfg).collect.mc_rollouts if a.target else cfg.collect.mc_rollouts
    if have != a.mc_rollouts:
        _fail("adapt.mc_rollouts", f"mc_feedback replays {a.mc_rollouts} continuations per pruned "
                                   f"prefix from the target bank's Monte Carlo labels, but that bank "
                                   f"is collected with collect.mc_rollouts={have}; give the target "
                                   f"collect.mc_rollouts: {a.mc_rollouts} in adapt.target (or set "
                                   f"adapt.mc_rollouts={have} if > 0, or evaluate.mode=online)")


def _check_model(cfg) -> None:
    m = cfg.model
    if m.name == "toy" and m.toy is None:
        _fail("model.toy", "the toy model needs its `toy:` section (see conf/model/toy.yaml)")
    if m.name == "toy":
        for key in TOY_UNREAD:
            if m[key] is not None:
                _fail(f"model.{key}", f"{m[key]!r} is read only by a hub or GGUF model (model=llama|"
                                      "qwen|smollm2); model=toy loads the embedded LM, sized by "
                                      "model.toy: leave it unset")
    elif m.toy is not None:
        _fail("model.toy", f"is read only by model=toy, not by model {m.name!r} (loaded from "
                           "model.path or model.gguf_file); drop the toy: section")
    if m.revision and not m.path:
        _fail("model.revision", f"{m.revision!r} is a hub revision, read only with model.path "
                                "(a hub id); leave it unset")
    if m.name != "toy" and not m.path and not m.gguf_file:
        _fail("model.path", f"model {m.name!r} needs a hub id or local directory (or model.gguf_file)")
    if m.path and m.gguf_file:
        _fail("model.gguf_file", "give either model.path or model.gguf_file, not both")
    if not DEVICE.fullmatch(m.device):
        _fail("model.device", f"{m.device!r} is not a device; allowed: auto, cpu, mps, cuda, cuda:N")
    for key in ("num_layers", "hidden_size", "max_batch_tokens", "max_prompt_tokens"):
        if m[key] is not None:
            _at_least(f"model.{key}", m[key], 1)
    s = cfg.search
    if m.max_batch_tokens is not None and m.max_batch_tokens < s.n_paths * (s.max_new_tokens + 1):
        _fail("model.max_batch_tokens", f"{m.max_batch_tokens} cannot hold one prompt's N paths: "
                                        f"needs >= N x (max_new_tokens + 1) = "
                                        f"{s.n_paths * (s.max_new_tokens + 1)} plus the prompt")
    t = m.toy
    if t is not None:
        for key in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "batch_size",
                    "max_steps", "eval_every", "screen_prompts", "screen_paths"):
            _at_least(f"model.toy.{key}", t[key], 1)
        _at_least("model.toy.warmup_steps", t.warmup_steps, 0)
        _at_least("model.toy.screen_max_new_tokens", t.screen_max_new_tokens, 2)
        _within("model.toy.lr", t.lr, 0, math.inf, low_open=True, high_open=True)
        _within("model.toy.target_accuracy", t.target_accuracy, 0, 1)
        _at_least("model.toy.screen_temperature", t.screen_temperature, MIN_TEMPERATURE)
        pinned = t.get("train_task") or {}
        allowed = ("n_steps", "operators", "multipliers", "styles", "split_fractions", "seed")
        if [k for k in pinned if k not in allowed]:
            _fail("model.toy.train_task", f"{[k for k in pinned if k not in allowed]} are not arith "
                                          f"task keys the toy LM learns; allowed: {', '.join(allowed)}")
        if pinned:  # the task the LM learns must be one the arith task can make
            try:
                _check_task(OmegaConf.merge(cfg.task, dict(pinned)))
            except ConfigError as e:
                raise ConfigError(f"model.toy.train_task: {e}") from None
        if t.hidden_size % t.num_heads:
            _fail("model.toy.num_heads", f"hidden_size {t.hidden_size} is not divisible by "
                                         f"{t.num_heads} heads")


def _check_task(t) -> None:
    if any(not x for x in t.stop):
        _fail("task.stop", "every stop string must be non-empty")
    if t.name == "qa" and not t.path:
        _fail("task.path", "task qa needs a .jsonl / .json / .parquet file or a hub dataset id")
    if "{question}" not in t.prompt_template:
        _fail("task.prompt_template", f"must contain {{question}}, got {t.prompt_template!r}")
    _at_least("task.n_steps", t.n_steps, 1)
    bad_ops = [o for o in t.operators if o not in ("+", "-", "*")]
    if bad_ops or not t.operators:
        _fail("task.operators", f"{bad_ops or 'empty'}: allowed operators are +, -, *")
    bad_mult = [x for x in t.multipliers if x not in (1, 3, 7, 9)]
    if bad_mult or ("*" in t.operators and not t.multipliers):
        _fail("task.multipliers", f"{bad_mult or 'empty'}: multipliers must be coprime to 10 "
                                  "(1, 3, 7, 9) so every step is a bijection")
    bad_styles = [k for k in t.styles if k not in ("careful", "shortcut")]
    weights = list(t.styles.values())
    if bad_styles or not weights or not all(w >= 0 for w in weights) or not sum(weights) > 0:
        _fail("task.styles", "weights >= 0 for careful and/or shortcut, not all zero"
                             + (f"; unknown: {bad_styles}" if bad_styles else ""))
    fr = t.split_fractions
    if (set(fr) != set(SPLITS) or not all(v > 0 for v in fr.values())
            or not abs(sum(fr.values()) - 1) <= 1e-6):
        _fail("task.split_fractions", f"needs train, val, test > 0 summing to 1, got {dict(fr)}")


def _check_search_and_taps(cfg) -> None:
    m, s, tap = cfg.model, cfg.search, cfg.tap
    _at_least("search.max_new_tokens", s.max_new_tokens, 2)
    if any(not x for x in s.stop):
        _fail("search.stop", "every stop string must be non-empty")
    if cfg.task.name in ("wordprob", "datatotext") and cfg.task.format == "fewshot" and m.chat_template \
            and m.name != "toy":
        _fail("model.chat_template", "task.format=fewshot is plain text after solved examples; "
                                     "set model.chat_template=false (or task.format=chat)")
    n_layers = m.toy.num_layers if m.toy is not None else m.num_layers
    if not tap.layers:
        _fail("tap.layers", "give at least one layer")
    for entry in tap.layers:
        if isinstance(entry, bool) or not isinstance(entry, (int, str)) or (
                isinstance(entry, str) and entry not in SYMBOLIC_LAYERS):
            _fail("tap.layers", f"{entry!r} is not a layer; give an index or one of "
                                f"{', '.join(SYMBOLIC_LAYERS)}")
        if n_layers is not None:
            try:
                layer_index(entry, n_layers)
            except ValueError as e:
                raise ConfigError(str(e)) from None
    # the format (and layers, heads where the config knows them) now; the rest at model load
    attention_heads(tap.attention_heads, list(tap.layers), n_layers,
                    m.toy.num_heads if m.toy is not None else None)
    if not s.temperature >= MIN_TEMPERATURE:
        _fail("search.temperature", f"must be >= {MIN_TEMPERATURE}, got {s.temperature} (smaller "
                                    "temperatures overflow float32 logits; use "
                                    "search.do_sample=false for greedy)")
    _within("search.top_p", s.top_p, 0, 1, low_open=True)
    _at_least("search.top_k", s.top_k, 0)
    if not s.n_paths >= 1:
        _fail("search.n_paths", f"N must be >= 1, got {s.n_paths}")
    for name in ("beam_width", "patience", "conf_topk", "group_window", "max_batch_rows"):
        _at_least(f"search.{name}", s[name], 1)
    ckpts = []
    for c in tap.checkpoints:
        if not c > 0 or (c >= 1 and c != int(c)):
            _fail("tap.checkpoints", f"{c} is neither a fraction in (0, 1) nor a whole token count")
        t = checkpoint_tokens(c, s.max_new_tokens)
        if not 1 <= t < s.max_new_tokens:
            _fail("tap.checkpoints", f"{c} is prefix {t}, beyond max length "
                                     f"{s.max_new_tokens} (search.max_new_tokens)")
        ckpts.append(t)
    pos = tap.positions
    for c in pos.checkpoints:
        t = checkpoint_tokens(c, s.max_new_tokens) if c > 0 else 0
        if not 1 <= t < s.max_new_tokens or (c >= 1 and c != int(c)):
            _fail("tap.positions.checkpoints", f"{c} is not a prefix in 1..{s.max_new_tokens - 1} "
                                               "tokens (or a fraction in (0, 1) of search.max_new_tokens)")
    if pos.stride is not None and not 1 <= pos.stride < s.max_new_tokens:
        _fail("tap.positions.stride", f"{pos.stride}: give a token count in 1.."
                                      f"{s.max_new_tokens - 1} (search.max_new_tokens), or null for none")
    if pos.step_ends:
        _check_step_ends(cfg)
    if s.beam_checks is not None and (s.name != "beam" or not len(s.beam_checks)):
        _fail("search.beam_checks", "[]: give the prefixes where beams are checked, or null for "
                                    "every step" if s.name == "beam" else
              f"only search=beam reads it, not search={s.name} (which checks at search.check_at); "
              "leave it null")
    if not s.refill and s.name != "beam":
        _fail("search.refill", f"false: only search=beam refills (or narrows), not search={s.name}; "
                               "leave it true")
    for c in s.beam_checks or []:
        t = checkpoint_tokens(c, s.max_new_tokens) if c > 0 else 0
        if not 1 <= t < s.max_new_tokens or (c >= 1 and c != int(c)):
            _fail("search.beam_checks", f"{c} is not a prefix in 1..{s.max_new_tokens - 1} "
                                        "tokens (or a fraction of search.max_new_tokens)")
    checks = check_values(s.check_at)
    if not checks:
        _fail("search.check_at", "give a prefix (one of tap.checkpoints) or a non-empty list of them")
    for key, value in [*(("search.check_at", c) for c in checks),
                       ("train.checkpoint", cfg.train.checkpoint)]:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
                or checkpoint_tokens(value, s.max_new_tokens) not in ckpts:
            _fail(key, f"{value} is not one of tap.checkpoints {list(tap.checkpoints)}")
    tokens = [checkpoint_tokens(c, s.max_new_tokens) for c in checks]
    if any(b <= a for a, b in zip(tokens, tokens[1:])):
        _fail("search.check_at", f"checks must be increasing prefixes, got {list(checks)} = "
                                 f"{tokens} tokens")
    keep = cfg.policy.keep
    keeps = check_values(keep)
    if any(isinstance(k, bool) or not isinstance(k, int) for k in keeps) or not keeps:
        _fail("policy.keep", f"{keep} is not a whole number K or a list of them (one per check "
                             "of search.check_at)")
    if len(keeps) > 1 and len(keeps) != len(checks) or (len(keeps) == 1 and _is_list(keep)
                                                           and len(checks) > 1):
        _fail("policy.keep", f"{len(keeps)} values for the {len(checks)} checks of "
                             f"search.check_at {list(checks)}; give one K per check")
    if (len(checks) > 1 or _is_list(keep)) and (s.name != "parallel" or cfg.stage == "adapt"):
        key = "search.check_at" if len(checks) > 1 else "policy.keep"
        _fail(key, "several checks (a list in search.check_at or policy.keep) are a "
                   "Launch-Check-Resume protocol of evaluate (search=parallel); "
                   f"{'adapt' if cfg.stage == 'adapt' else 'search=' + s.name} takes one prefix "
                   "and one K")
    if _is_list(keep) and cfg.policy.name != "topk":
        _fail("policy.keep", f"{list(keep)}: only policy=topk reads K, not policy="
                             f"{cfg.policy.name}; leave policy.keep unset (a single number)")
    if cfg.policy.name == "topk" and len(checks) > 1:
        plan = keeps * len(checks) if len(keeps) == 1 else keeps
        if any(b >= a for a, b in zip(plan, plan[1:])):
            _fail("policy.keep", f"{keep if len(keeps) == 1 else list(keep)} for the checks "
                                 f"{list(checks)} of search.check_at: after keeping K paths a "
                                 "check sees at most K, so a later check keeping as many or more "
                                 "prunes nothing; give one decreasing K per check (e.g. [16, 8])")


def _check_step_ends(cfg) -> None:
    """tap.positions.step_ends needs a task with a step separator (its `step_separator`)
    that is not itself a stop string: a path ends at a stop string, so no step of it
    would end before the path does."""
    from stopexp.tasks import TASKS

    name = cfg.task.name
    with_steps = [n for n, t in TASKS.items() if getattr(t, "step_separator", None)]
    sep = getattr(TASKS.get(name), "step_separator", None)
    if not sep:
        _fail("tap.positions.step_ends", f"task {name} has no step separator (a path is one "
                                         f"sentence); allowed with tasks {', '.join(with_steps)}, "
                                         "else use tap.positions.stride or tap.positions.checkpoints")
    stops = [x for x in stop_strings(cfg.task, cfg.search) if x in sep]
    if stops:
        _fail("tap.positions.step_ends", f"the step separator {sep!r} of task {name} completes "
                                         f"the stop string {stops[0]!r} (task.stop / search.stop), "
                                         "so a path ends at its first step end and none would be "
                                         "stored; drop that stop string or use tap.positions.stride")


def _check_collect(cfg) -> None:
    c, s = cfg.collect, cfg.search
    _at_least("collect.mc_rollouts", c.mc_rollouts, 0)
    for split, n in c.prompts.items():
        if split not in cfg.task.split_fractions:
            _fail("collect.prompts", f"split {split!r} unknown; allowed: "
                                     f"{', '.join(cfg.task.split_fractions)}")
        _at_least(f"collect.prompts.{split}", n, 0)
    band = c.keep_correct
    if band is not None and (len(band) != 2 or not 0 <= band[0] <= band[1] <= s.n_paths):
        _fail("collect.keep_correct", f"needs [lo, hi] with 0 <= lo <= hi <= N={s.n_paths}, "
                                      f"got {list(band)}")
    bad = [x for x in c.keep_correct_splits if x not in SPLITS]
    if bad:
        _fail("collect.keep_correct_splits", f"{bad} unknown; allowed: {', '.join(SPLITS)}")
    # the band exists for training: at every stage, so that no such bank is ever collected
    if band is not None and (band[1] < 1 or band[0] > s.n_paths - 1):
        _fail("collect.keep_correct", f"{list(band)} keeps only {'/'.join(c.keep_correct_splits)} "
                                      f"prompts whose N={s.n_paths} paths all fail or all succeed, "
                                      "which leaves train no pair to learn from; use a band within "
                                      f"[1, {max(s.n_paths - 1, 1)}]")
    if band is not None and not c.keep_correct_splits:
        _fail("collect.keep_correct", f"{list(band)} filters no split: collect.keep_correct_splits "
                                      "is empty; name the splits it filters, or leave the band unset")
    _at_least("collect.shard_prompts", c.shard_prompts, 1)
    if c.world is not None:
        _at_least("collect.world", c.world, 1)
    if c.rank is not None and (c.rank < 0 or (c.world is not None and c.rank >= c.world)):
        _fail("collect.rank", f"{c.rank} must lie in 0..collect.world-1 (world {c.world})")


def _check_predictor_loss_train(cfg) -> None:
    pred, loss, tr = cfg.predictor, cfg.loss, cfg.train
    _at_least("predictor.hidden", pred.hidden, 1)
    _at_least("predictor.depth", pred.depth, 0)
    _within("predictor.dropout", pred.dropout, 0, 1, high_open=True)
    if pred.n_tokens < 1 or pred.lora_rank < 1 or not pred.lora_targets:
        _fail("predictor", f"super_token needs n_tokens >= 1, lora_rank >= 1 and lora_targets; got "
                           f"n_tokens={pred.n_tokens}, lora_rank={pred.lora_rank}, "
                           f"lora_targets={list(pred.lora_targets)}")
    _within("predictor.lora_alpha", pred.lora_alpha, 0, math.inf, low_open=True, high_open=True)
    _check_predictor_signals(cfg)
    if cfg.stage in ("train", "evaluate", "pipeline", "adapt") and pred.name in ("statistic", "linear", "mlp"):
        _check_predictor_layer(cfg)
    _at_least("loss.margin", loss.margin, 0)
    _within("loss.discount", loss.discount, 0, 1, low_open=True)
    _at_least("loss.length_reg", loss.length_reg, 0)
    for key in ("epochs", "batch_prompts", "patience"):
        _at_least(f"train.{key}", tr[key], 1)
    _within("train.lr", tr.lr, 0, math.inf, low_open=True, high_open=True)
    _at_least("train.weight_decay", tr.weight_decay, 0)
    if pred.position_input and pred.name not in POSITION_INPUT_PREDICTORS:
        why = ("reads prefix_len among its signal columns already" if pred.name == "conf_features"
               else "has no learned head to feed it")
        _fail("predictor.position_input", f"predictor={pred.name} {why}; allowed with "
                                          f"{', '.join(POSITION_INPUT_PREDICTORS)}")
    if pred.position_input and tr.positions != "all":
        _fail("predictor.position_input", "trained at one checkpoint (train.positions=checkpoint) "
                                          "the position is the same for every path, so the head "
                                          "learns nothing from it; set train.positions=all")
    if tr.positions == "all" and pred.name == "super_token":
        _fail("train.positions", "all needs stored features at every position, but super_token "
                                 "re-encodes each prefix with the LM; use train.positions=checkpoint")


# the predictors whose head takes the position as an extra input (predictor.position_input)
POSITION_INPUT_PREDICTORS = ("linear", "mlp", "fusion")


def _check_reward(cfg) -> None:
    """reward.*: an external reward names a registered or importable function; the
    regression losses need a reward in [0, 1]; nothing else is read unused."""
    from stopexp.tasks.rewards import BOUNDED, resolve_external

    r = cfg.reward
    if r.name == "external":
        if not r.function:
            _fail("reward.function", "reward=external needs a function: a name registered with "
                                     "stopexp.tasks.rewards.register_reward, or module:function")
        try:
            resolve_external(r.function)
        except ValueError as e:
            _fail("reward.function", str(e))
    elif r.function:
        _fail("reward.function", f"only reward=external reads it, not reward={r.name}; leave it unset")
    if r.bertscore_model and r.name != "bertscore":
        _fail("reward.bertscore_model", f"only reward=bertscore reads it, not reward={r.name}")
    bert = r.bertscore_model
    if bert and bert.startswith(("/", ".", "~")) and not Path(bert).expanduser().is_dir():
        _fail("reward.bertscore_model", f"{bert!r} is no model directory; give a local "
                                        "directory, a hub id, or leave it unset for the bundled MiniLM")
    if r.name not in BOUNDED and cfg.loss.name in ("reward_regression", "mse"):
        _fail("loss.name", f"{cfg.loss.name} regresses a probability on the reward, which must lie "
                           f"in [0, 1]; reward={r.name} is unbounded: use loss=contrastive or pairwise")
    if r.name == "neg_perplexity" and cfg.evaluate.mode == "online" and cfg.stage in ("evaluate", "pipeline"):
        _fail("evaluate.mode", "online paths carry text only; reward=neg_perplexity needs the per-token "
                               "log-probs of the bank: use evaluate.mode=replay")
    _at_least("loss.min_gap", cfg.loss.min_gap, 0)
    if cfg.loss.min_gap and cfg.loss.name not in ("contrastive", "pairwise"):
        _fail("loss.min_gap", f"only loss=contrastive | pairwise skip pairs by it, not "
                              f"loss={cfg.loss.name}; leave it 0")
    if r.name in BOUNDED and cfg.loss.min_gap >= 1:
        _fail("loss.min_gap", f"{cfg.loss.min_gap} skips every pair: reward={r.name} lies in "
                              "[0, 1], so no reward gap exceeds it; allowed: [0, 1)")


def _check_predictor_signals(cfg) -> None:
    """predictor.signals: signal column names (stopexp.signals.features.SIGNAL_NAMES), read
    by conf_features only; attn_entropy needs tap.attention_heads."""
    from stopexp.signals.features import SIGNAL_NAMES

    names = list(cfg.predictor.signals)
    if names and cfg.predictor.name != "conf_features":
        _fail("predictor.signals", f"only predictor=conf_features reads signal columns, not "
                                   f"{cfg.predictor.name}; leave it empty")
    for name in names:
        if name not in SIGNAL_NAMES:
            _fail("predictor.signals", f"{name!r} unknown; allowed: {', '.join(SIGNAL_NAMES)}")
    if "attn_entropy" in names and cfg.tap.attention_heads is None:
        _fail("predictor.signals", "attn_entropy needs the attention tap: set tap.attention_heads")


def _check_predictor_layer(cfg) -> None:
    """predictor.layer must be a tapped layer, or -1..-len(tap.layers) counted from the
    deepest tapped one (stopexp.signals.features.tap_index), as far as the config tells."""
    layer, entries = cfg.predictor.layer, list(cfg.tap.layers)
    m = cfg.model
    n_layers = m.toy.num_layers if m.toy is not None else m.num_layers
    tapped = (resolve_layers(entries, n_layers) if n_layers is not None
              else entries if all(isinstance(e, int) and e >= 0 for e in entries) else None)
    count = len(tapped) if tapped is not None else len(entries)
    if layer < 0 and -count <= layer:
        return
    if layer >= 0 and (tapped is None or layer in tapped):
        return
    _fail("predictor.layer", f"{layer} is not a tapped layer; allowed: "
                             f"{tapped if tapped is not None else entries} (tap.layers) or "
                             f"-1..-{count} counted from the deepest tapped layer")


def check_method_names(names) -> None:
    """Every name in evaluate.methods is a built-in method, a predictor, `learned`, or a
    scorer registered with stopexp.signals.methods.register_external; ConfigError otherwise."""
    from stopexp.signals.methods import external

    builtin = {*ALWAYS_METHODS, *BASELINE_METHODS, *STOPPING_METHODS, *ALLOWED["predictor.name"],
               "learned"}
    for name in names:
        if name not in builtin and external(name) is None:
            _fail("evaluate.methods", f"{name!r} unknown; allowed: {', '.join(sorted(builtin))} or "
                                      "a scorer registered with stopexp.signals.methods.register_external")


def _check_evaluate(cfg) -> None:
    ev, s, pol = cfg.evaluate, cfg.search, cfg.policy
    check_method_names(ev.methods)
    if "attn_entropy" in ev.methods and cfg.tap.attention_heads is None:
        _fail("evaluate.methods", "attn_entropy needs the attention tap: set tap.attention_heads "
                                  "(all, or a list of layer:head)")
    bert = ev.bertscore_model
    if ev.text_metrics and bert and bert.startswith(("/", ".", "~")) and not Path(bert).expanduser().is_dir():
        _fail("evaluate.bertscore_model", f"{bert!r} is no model directory; give a local "
                                          "directory, a hub id, or leave it unset for the bundled MiniLM")
    if ev.split not in SPLITS:
        _fail("evaluate.split", f"{ev.split!r} unknown; allowed: {', '.join(SPLITS)}")
    if not cfg.collect.prompts.get(ev.split, 0) > 0:
        _fail("evaluate.split", f"the trace bank holds no {ev.split!r} prompts "
                                f"(collect.prompts.{ev.split}={cfg.collect.prompts.get(ev.split, 0)})")
    _at_least("evaluate.bootstrap", ev.bootstrap, 1)
    if s.name == "beam" and (ev.select != "vote" or ev.compare_beam):
        key = "evaluate.select" if ev.select != "vote" else "evaluate.compare_beam"
        _fail(key, "search=beam outputs one hypothesis per prompt: nothing to select among, and it "
                   "is the beam search to compare with; use search=parallel")
    for k in check_values(pol.keep):
        if not 1 <= k <= s.n_paths:
            _fail("policy.keep", f"retention K={k} must lie in 1..N={s.n_paths} (search.n_paths)"
                                 f"{_TOGETHER.format(key='policy.keep')}")
    _within("evaluate.vote_top", ev.vote_top, 0, 1, low_open=True)
    if ev.vote_top != EvaluateConfig.vote_top and ev.vote != "filtered":
        _fail("evaluate.vote_top", f"{ev.vote_top}: only evaluate.vote=filtered reads it, not "
                                   f"vote={ev.vote}")
    if ev.select != "vote" and ev.vote != "majority":
        _fail("evaluate.vote", f"{ev.vote!r} is not used: evaluate.select={ev.select} selects one "
                               "path instead of voting; set evaluate.select=vote, or leave "
                               "evaluate.vote majority")
    for k in ev.retention:
        if not 1 <= k <= s.n_paths:
            _fail("evaluate.retention", f"K={k} must lie in 1..N={s.n_paths} (search.n_paths)"
                                        f"{_TOGETHER.format(key='evaluate.retention')}")
    for n in ev.n_points:
        if not 1 <= n <= s.n_paths:
            _fail("evaluate.n_points", f"N={n} must lie in 1..{s.n_paths} (search.n_paths)"
                                       f"{_TOGETHER.format(key='evaluate.n_points')}")
    _at_least("evaluate.esc_window", ev.esc_window, 1)
    _within("evaluate.asc_threshold", ev.asc_threshold, 0, 1, low_open=True)
    _within("evaluate.deepconf_keep_percent", ev.deepconf_keep_percent, 0, 100, low_open=True)
    if "deepconf_online" in ev.methods and not 1 <= warmup_paths(ev.deepconf_warmup, s.n_paths) < s.n_paths:
        _fail("evaluate.deepconf_warmup", f"{ev.deepconf_warmup} gives "
                                          f"{warmup_paths(ev.deepconf_warmup, s.n_paths)} warm-up paths; "
                                          f"they must lie in 1..{s.n_paths - 1} (below search.n_paths)"
                                          + ("; set it to a count below search.n_paths" if s.n_paths > 1 else
                                             "; DeepConf online needs search.n_paths >= 2: drop "
                                             "deepconf_online from evaluate.methods"))
    _within("policy.quantile", pol.quantile, 0, 1, low_open=True, high_open=True)
    _within("policy.target_prune_rate", pol.target_prune_rate, 0, 1, high_open=True)
    _at_least("policy.gain", pol.gain, 0)
    if s.name == "beam" and ev.vote != "majority":
        _fail("evaluate.vote", f"{ev.vote!r}: beam search returns one hypothesis per prompt, "
                               "there is no vote to weight or filter; leave it majority")
    if s.name == "beam" and s.score_rule != "last":
        _fail("search.score_rule", f"{s.score_rule!r} is for Launch-Check-Resume with several "
                                   "checks; beam search acts on each step's score (search.patience)")
    if s.name == "beam" and pol.name == "topk" and pol.keep >= s.beam_width:
        _fail("policy.keep", f"policy=topk keeps K={pol.keep} of at most search.beam_width="
                             f"{s.beam_width} live beams, so beam search would never prune and "
                             "every method would equal no_prune; use policy=quantile (as "
                             "+exp=toy_beam does), policy=fixed or a K below the beam width")


def check_output_dirs(cfg) -> None:
    """Every output location (paths.output_dir, paths.cache_dir) exists or can be made, and
    a file can be written in it; ConfigError names the key otherwise. Call before compute,
    so a read-only cache is found before the LM loads. Writes and removes a probe file
    (root may write where permissions say no, so asking os.access is not enough)."""
    import tempfile

    for key in ("paths.output_dir", "paths.cache_dir"):
        where = Path(_get(cfg, key))
        try:
            where.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(dir=where, prefix=".write-probe-")
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            _fail(key, f"cannot write to {where} ({e.strerror or e}); point {key} at a writable "
                       "directory")

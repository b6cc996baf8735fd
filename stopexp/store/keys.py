"""Where a trace bank lives: its key, the hash of everything its content depends on (the
model, the task and its file's content, the sampling, collect's labels, the seed, the
reward, the engine where it is not hf, the dtype and device kind `auto` resolves to on this
machine where they are not a CPU's float32, the bank format's version), and nothing else
(batch sizes, ranks, loggers, later stages), so that any config that would make the same
paths finds them. Features and predictors are keyed on the bank's key, so they follow it.

What a config names by a local file counts by the file's content, not its path: a local
model directory (weights, tokenizer, chat template: every file a loader reads), a GGUF
file, a task's data file, an evaluate module, an external reward's module, a local
BERTScore encoder. Their SHA-256 is read once per version of each file and remembered
under `<cache>/content_sha256` (stopexp.runtime.integrity.content_sha256), so an unchanged
model costs a stat per file. A hub id counts by its id and model.revision.

A trained predictor's key (`predictor_key`) leaves the keys added to its sections since
predictors were first saved out at their defaults, as the bank's leaves settings out."""
from __future__ import annotations

import functools
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from omegaconf import OmegaConf

from stopexp.core.added_keys import LOSS_KEYS_ADDED, PREDICTOR_KEYS_ADDED, TRAIN_KEYS_ADDED
from stopexp.core.evaluate_modules import module_script
from stopexp.core.names import lookup
from stopexp.core.protocol import checkpoints_of
from stopexp.core.config_text import decode_escapes, decoded_text
from stopexp.models import resolved_numerics
from stopexp.models.gguf import resolve_gguf
from stopexp.runtime.artifacts import config_hash, plain
from stopexp.runtime.integrity import content_sha256, file_sha256
from stopexp.tasks.benchmarks import shipped_file

# 2: shard records in meta.json and shard.json; task content in the key
# 3: signal columns hidden_mean and hidden_var; per-path prompt_len; kv_bytes_per_token
# 4: paths only (no hidden, signals, alive): features live in <cache>/features
# (a bank of a task with intermediate values also holds first_wrong_value: keyed by the task)
BANK_VERSION = 4


@dataclass(frozen=True)
class BankSpec:
    """Where a trace bank lives and what its meta.json must record (`expected_meta`), from
    the config alone; a stage builds it once (stopexp.stages.build.bank, from `bank_spec`)."""
    root: Path                  # <cache>/traces/<bank_key>
    want: dict                  # expected_meta
    checkpoints: list[int]      # where the bank holds Monte Carlo labels (mc_checkpoints)
    # prompts per split -> the key of the bank that differs from this one in collect.prompts
    # alone (stopexp.store.bank_growth); None: no such bank is looked for
    key_with: Callable[[dict], str] | None = field(default=None, compare=False)

    @property
    def key(self) -> str:
        return self.root.name


def bank_spec(*, model, task, search, collect, tap, seed: int, reward, engine, cache_dir) -> BankSpec:
    """The BankSpec of these sections (reward, engine: None where the config has none),
    under `cache_dir`."""
    key = bank_key(model=model, task=task, search=search, collect=collect, tap=tap, seed=seed,
                   reward=reward, engine=engine, cache_dir=cache_dir)
    checkpoints = mc_checkpoints(tap, search, collect)
    key_with = functools.partial(_key_with_prompts, model=model, task=task, search=search,
                                 collect=collect, tap=tap, seed=seed, reward=reward,
                                 engine=engine, cache_dir=cache_dir)
    return BankSpec(Path(cache_dir) / "traces" / key,
                    expected_meta(model, search, collect, seed, checkpoints, key), checkpoints,
                    key_with)


def _key_with_prompts(prompts: dict, *, collect, **sections) -> str:
    """bank_key of `sections` with collect.prompts set to `prompts` (split -> count)."""
    return bank_key(collect=OmegaConf.create({**plain(collect), "prompts": dict(prompts)}), **sections)


def expected_meta(model, search, collect, seed: int, checkpoints: list[int], key: str) -> dict:
    """What the bank must record, from the config alone: the LM's name, its width and depth
    where the `model` section gives them (the toy LM's always), the sampling and the labels
    the consumers rely on (Monte Carlo labels at `checkpoints`), and the `key` it sits under."""
    size = model.toy if model.get("toy") is not None else model
    want = {"model_name": model.name}
    want.update({k: size[k] for k in ("hidden_size", "num_layers") if size.get(k) is not None})
    return {**want, "n_paths": search.n_paths, "seed": seed,
            "mc_rollouts": collect.mc_rollouts, "checkpoints": checkpoints, "key": key}


def mc_checkpoints(tap, search, collect) -> list[int]:
    """Where the bank holds Monte Carlo labels: tap.checkpoints when collect runs rollouts,
    else none (the bank then does not depend on the checkpoints at all)."""
    return checkpoints_of(tap.checkpoints, search.max_new_tokens) if collect.mc_rollouts > 0 else []


def sampling_section(search) -> dict:
    keys = ("n_paths", "max_new_tokens", "temperature", "top_p", "top_k", "do_sample",
            "conf_topk", "group_window", "stop")
    out = {k: search[k] for k in keys}
    # stop strings change the paths' content: as they are used, escapes decoded
    out["stop"] = [decode_escapes(x) for x in out["stop"]]
    return out


def task_content(task_cfg, store: Path | None = None) -> str | None:
    """What a file-based task's questions are, for the bank's hash: the SHA-256 of a local
    or shipped file (a benchmark named by `task.path`, stopexp.tasks.benchmarks); for a hub
    dataset id, the cached revision (commit) when the local Hugging Face cache has one,
    else the id alone. None for tasks without a path (the embedded one). `store`: where
    digests are remembered (`content_sha256`)."""
    path = task_cfg.get("path") if hasattr(task_cfg, "get") else None
    if not path:
        return None
    p = shipped_file(path) or Path(path).expanduser()
    if p.is_file():
        return "sha256:" + content_sha256(p, store)
    if p.exists() or p.suffix in (".jsonl", ".json", ".parquet"):
        return "unreadable"  # collect refuses it, naming task.path
    from huggingface_hub.constants import HF_HUB_CACHE

    refs = Path(HF_HUB_CACHE) / f"datasets--{path.replace('/', '--')}" / "refs" / "main"
    return f"hub:{path}@{refs.read_text().strip()}" if refs.is_file() else f"hub:{path}"


# files of a model directory that no loader reads: documentation, licences, pictures
_NOT_READ = re.compile(r"(?i)^(readme|licen[cs]e|notice|use_policy)|\.(md|png|jpe?g|gif|svg|pdf)$")


def directory_content(directory: Path, store: Path | None = None) -> str:
    """A model directory's content: the SHA-256 of each file a loader may read (its top
    level, the hidden files and `_NOT_READ` left out), by name."""
    files = sorted(p for p in Path(directory).iterdir()
                   if p.is_file() and not p.name.startswith(".") and not _NOT_READ.search(p.name))
    return "sha256:" + config_hash({p.name: content_sha256(p, store) for p in files})


def model_content(model, store: Path | None = None) -> str | None:
    """What the LM's weights, tokenizer and chat template are, where a local file holds
    them: the content of `model.gguf_file`, or of `model.path` when it is a local
    directory; None for the toy LM (its key is its config) and hub ids."""
    if model.get("gguf_file"):
        try:
            return "sha256:" + content_sha256(resolve_gguf(model["gguf_file"]), store)
        except FileNotFoundError:
            return "unreadable"  # loading refuses it, naming model.gguf_file
    path = model.get("path")
    if path and Path(path).expanduser().is_dir():
        return directory_content(Path(path).expanduser(), store)
    return None


def content_store(cache_dir) -> Path | None:
    """Where file digests are remembered: beside the artifacts of `cache_dir`."""
    return Path(cache_dir) / "content_sha256" if cache_dir is not None else None


def bank_key(*, model, task, search, collect, tap, seed: int, reward=None, engine=None,
             cache_dir=None) -> str:
    """What the bank's content depends on (not batch sizes, the rank that wrote a shard,
    loggers or later stages); a local file (model, task, module) counts by its content, not
    its path alone. `reward`, `engine`: None where the config has none (the defaults);
    `cache_dir`: where file digests are remembered (None: in this process only). Settings
    that only some configs use (thinking, tokenize, shot_match, reward, engine, ...) are
    left out at their defaults, so a bank's key names only what differs from the defaults
    and a new setting leaves the key of every bank that does not use it."""
    store = content_store(cache_dir)
    # where the weights sit (one device or several) changes no number: left out
    lm = {k: v for k, v in plain(model).items() if k not in ("max_batch_tokens", "device_map")}
    weights = model_content(lm, store)
    if weights is not None:  # None: a hub id or the toy LM, which the section names in full
        lm["content"] = weights
    if isinstance(lm.get("toy"), dict) and not lm["toy"].get("train_task", True):
        lm["toy"] = {k: v for k, v in lm["toy"].items() if k != "train_task"}  # unpinned: left out
    if (lm.get("thinking") or {}).get("enabled") is None:  # not read as thinking (the default): left out
        lm.pop("thinking", None)
    if lm.get("long_prompts", "error") == "error":  # refusing changes no bank's content
        lm.pop("long_prompts", None)
        lm.pop("max_prompt_tokens", None)
    labels = {k: v for k, v in plain(collect).items() if k not in ("rank", "world")}
    questions = decoded_text(plain(task))  # text keys as the task reads them
    if questions.get("tokenize") == "13a":  # the default: left out
        questions.pop("tokenize")
    # solution_style keys the banks that record first_wrong_value (a task with
    # intermediate values) only
    if lookup("task", questions["name"]).wrong_value_end is None:
        questions.pop("solution_style", None)
    if questions.get("shot_match") == "first_operation":  # the default: left out
        questions.pop("shot_match")
    if questions.get("prompt_offset") == 0:  # the default: left out
        questions.pop("prompt_offset")
    if not questions.get("components"):  # read by task=mixture only: left out elsewhere
        questions.pop("components", None)
    content = task_content(task, store)
    if content is not None:
        questions = {**questions, "content": content}
    # Tap layers, pooling, attention heads and feature positions are not generation: they
    # key the features (stopexp.store.feature_sets). The checkpoints count only when collect runs
    # Monte Carlo rollouts there (the labels are generated); without rollouts the same
    # paths serve any checkpoints.
    mc = {"mc_checkpoints": mc_checkpoints(tap, search, collect)} if collect.mc_rollouts > 0 else {}
    key = {"version": BANK_VERSION, "model": lm, "task": questions, "tap": mc,
           "search": sampling_section(search), "collect": labels, "seed": seed}
    if reward is not None and reward.name != "correct":  # the default: left out
        key["reward"] = reward_section(reward, store)
    if engine is not None and engine.name != "hf":  # the default: left out
        key["engine"] = engine_section(engine)
    numerics = numerics_section(model, engine)
    if numerics is not None:
        key["numerics"] = numerics
    return config_hash(key)


def numerics_section(model, engine=None) -> dict | None:
    """The dtype and device kind the paths are computed in (`auto` resolved on this
    machine: stopexp.models.resolved_numerics), where they differ from what the config says
    read as on a CPU (dtype auto: float32, device auto: cpu); None where they do not. So a
    GPU's bfloat16 bank never shares a key with a CPU's float32 one, and every bank whose
    config already says its numerics (every CPU bank) keeps its key."""
    m = plain(model)
    on_vllm = engine is not None and engine.name == "vllm"
    written = plain(engine)["dtype"] if on_vllm else m.get("dtype", "auto")
    device = m.get("device", "auto")
    dtype, kind = resolved_numerics(written, device, on_vllm)
    as_written = ("float32" if written == "auto" else written,
                  "cpu" if device == "auto" else device.split(":")[0])
    return None if (dtype, kind) == as_written else {"dtype": dtype, "device": kind}


def reward_section(reward, store: Path | None = None) -> dict:
    """reward.* as it keys a bank: the content of the code or model a reward runs (an edited
    file makes other rewards): an evaluate module's script, an external `module:function`'s
    source file, a local BERTScore encoder directory; `module` and `key` only where set
    (left out at None, the default)."""
    out = {k: v for k, v in plain(reward).items() if not (k in ("module", "key") and v is None)}
    if reward.name == "evaluate":
        out["module_sha256"] = file_sha256(module_script(reward.module))
    source = module_source(reward.get("function")) if reward.name == "external" else None
    if source is not None:
        out["function_sha256"] = content_sha256(source, store)
    encoder = reward.get("bertscore_model") if reward.name == "bertscore" else None
    if encoder and Path(encoder).expanduser().is_dir():
        out["bertscore_content"] = directory_content(Path(encoder).expanduser(), store)
    return out


def module_source(function: str | None) -> Path | None:
    """The source file of a `module:function` reward (None: a registered name, or a module
    without a Python source)."""
    module, sep, _ = (function or "").partition(":")
    if not sep:
        return None
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    origin = Path(spec.origin) if spec is not None and spec.origin else None
    return origin if origin is not None and origin.suffix == ".py" and origin.is_file() else None


# engine keys that size memory or a scheduler's step, or say where states are read; they
# change no path
ENGINE_MEMORY_KEYS = ("gpu_memory_utilization", "cpu_kvcache_space", "max_num_batched_tokens",
                      "taps", "block_size", "kv_budget")  # kv_budget: STEP's evaluation, not collect


def engine_section(engine) -> dict:
    """What of `engine` the paths depend on (for the bank's key)."""
    return {k: v for k, v in plain(engine).items() if k not in ENGINE_MEMORY_KEYS}


# train keys that size memory; they change no weight
TRAIN_MEMORY_KEYS = ("prefix_cache_gb",)


def without_added_defaults(section, added: dict) -> dict:
    """`section` (plain) without the keys of `added` that hold the value given there."""
    return {k: v for k, v in plain(section).items() if not (k in added and v == added[k])}


def predictor_key(features_key: str, predictor, loss, train, selection_share: float = 0.0) -> str:
    """What a trained predictor depends on: its features (their key), the predictor, loss
    and train sections and, where it is not 0, the share of the training prompts its epoch
    is picked on (policy=risk). Keys added since predictors were first saved
    (PREDICTOR_KEYS_ADDED, LOSS_KEYS_ADDED, TRAIN_KEYS_ADDED) are left out at their defaults,
    as bank_key leaves settings out, so every predictor that does not use them keeps its key;
    TRAIN_MEMORY_KEYS are left out at any value."""
    return config_hash(features_key, without_added_defaults(predictor, PREDICTOR_KEYS_ADDED),
                       without_added_defaults(loss, LOSS_KEYS_ADDED),
                       {k: v for k, v in without_added_defaults(train, TRAIN_KEYS_ADDED).items()
                        if k not in TRAIN_MEMORY_KEYS},
                       *([{"selection_share": selection_share}] if selection_share else []))

"""Where a trace bank lives: its key, the hash of everything its content depends on (the
model, the task and its file's content, the sampling, collect's labels, the seed, the
reward, the engine where it is not hf, the bank format's version), and nothing else (batch sizes, ranks, loggers, later
stages), so that any config that would make the same paths finds them."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from stopexp.core.evaluate_modules import module_script
from stopexp.core.names import INTERMEDIATE_VALUE_TASKS
from stopexp.core.protocol import checkpoint_tokens
from stopexp.core.text import decode_escapes, decoded_text
from stopexp.runtime.artifacts import config_hash, plain
from stopexp.runtime.integrity import file_sha256
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

    @property
    def key(self) -> str:
        return self.root.name


def bank_spec(*, model, task, search, collect, tap, seed: int, reward, engine, cache_dir) -> BankSpec:
    """The BankSpec of these sections (reward, engine: None where the config has none),
    under `cache_dir`."""
    key = bank_key(model=model, task=task, search=search, collect=collect, tap=tap, seed=seed,
                   reward=reward, engine=engine)
    checkpoints = mc_checkpoints(tap, search, collect)
    return BankSpec(Path(cache_dir) / "traces" / key,
                    expected_meta(model, search, collect, seed, checkpoints, key), checkpoints)


def expected_meta(model, search, collect, seed: int, checkpoints: list[int], key: str) -> dict:
    """What the bank must record, from the config alone: the LM's name, its width and depth
    where the `model` section gives them (the toy LM's always), the sampling and the labels
    the consumers rely on (Monte Carlo labels at `checkpoints`), and the `key` it sits under."""
    size = model.toy if model.get("toy") is not None else model
    want = {"model_name": model.name}
    want.update({k: size[k] for k in ("hidden_size", "num_layers") if size.get(k) is not None})
    return {**want, "n_paths": search.n_paths, "seed": seed,
            "mc_rollouts": collect.mc_rollouts, "checkpoints": checkpoints, "key": key}


def checkpoints_of(checkpoints, max_new_tokens: int) -> list[int]:
    """tap.checkpoints in generated tokens, sorted and distinct."""
    return sorted({checkpoint_tokens(c, max_new_tokens) for c in checkpoints})


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


def task_content(task_cfg) -> str | None:
    """What a file-based task's questions are, for the bank's hash: the SHA-256 of a local
    or shipped file (a benchmark named by `task.path`, stopexp.tasks.benchmarks); for a hub
    dataset id, the cached revision (commit) when the local Hugging Face cache has one,
    else the id alone. None for tasks without a path (the embedded one)."""
    path = task_cfg.get("path") if hasattr(task_cfg, "get") else None
    if not path:
        return None
    p = shipped_file(path) or Path(path).expanduser()
    if p.is_file():
        st = p.stat()
        return "sha256:" + _file_digest(str(p.resolve()), st.st_size, st.st_mtime_ns)
    if p.exists() or p.suffix in (".jsonl", ".json", ".parquet"):
        return "unreadable"  # collect refuses it, naming task.path
    from huggingface_hub.constants import HF_HUB_CACHE

    refs = Path(HF_HUB_CACHE) / f"datasets--{path.replace('/', '--')}" / "refs" / "main"
    return f"hub:{path}@{refs.read_text().strip()}" if refs.is_file() else f"hub:{path}"


@functools.lru_cache(maxsize=64)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    """A file's SHA-256, computed once per version of the file (size, mtime) and process."""
    return file_sha256(Path(path))


def bank_key(*, model, task, search, collect, tap, seed: int, reward=None, engine=None) -> str:
    """What the bank's content depends on (not batch sizes, the rank that wrote a shard,
    loggers or later stages); a file-based task counts by its content, not its path alone.
    `reward`, `engine`: None where the config has none (the defaults)."""
    lm = {k: v for k, v in plain(model).items() if k != "max_batch_tokens"}
    if isinstance(lm.get("toy"), dict) and not lm["toy"].get("train_task", True):
        lm["toy"] = {k: v for k, v in lm["toy"].items() if k != "train_task"}  # unpinned: keys as before
    if (lm.get("thinking") or {}).get("enabled") is None:  # not read as thinking: keys as before
        lm.pop("thinking", None)
    if lm.get("long_prompts", "error") == "error":  # refusing changes no bank's content
        lm.pop("long_prompts", None)
        lm.pop("max_prompt_tokens", None)
    labels = {k: v for k, v in plain(collect).items() if k not in ("rank", "world")}
    questions = decoded_text(plain(task))  # text keys as the task reads them
    if questions.get("tokenize") == "13a":  # the default: keys as before
        questions.pop("tokenize")
    # unread off wordprob: keys as before; a wordprob bank (which now records
    # first_wrong_value) gets a new key
    if questions.get("name") not in INTERMEDIATE_VALUE_TASKS:
        questions.pop("solution_style", None)
    if questions.get("shot_match") == "first_operation":  # the default: keys as before
        questions.pop("shot_match")
    content = task_content(task)
    if content is not None:
        questions = {**questions, "content": content}
    # Tap layers, pooling, attention heads and feature positions are not generation: they
    # key the features (stopexp.store.features). The checkpoints count only when collect runs
    # Monte Carlo rollouts there (the labels are generated); without rollouts the same
    # paths serve any checkpoints.
    mc = {"mc_checkpoints": mc_checkpoints(tap, search, collect)} if collect.mc_rollouts > 0 else {}
    key = {"version": BANK_VERSION, "model": lm, "task": questions, "tap": mc,
           "search": sampling_section(search), "collect": labels, "seed": seed}
    if reward is not None and reward.name != "correct":  # the default: keys as before
        key["reward"] = reward_section(reward)
    if engine is not None and engine.name != "hf":  # the default: keys as before
        key["engine"] = engine_section(engine)
    return config_hash(key)


def reward_section(reward) -> dict:
    """reward.* as it keys a bank: an evaluate module with its script's content (an edited
    module makes other rewards); the evaluate keys only where set (other rewards: keys as before)."""
    out = {k: v for k, v in plain(reward).items() if not (k in ("module", "key") and v is None)}
    if reward.name == "evaluate":
        out["module_sha256"] = file_sha256(module_script(reward.module))
    return out


# engine keys that size memory or a scheduler's step only; they change no path
ENGINE_MEMORY_KEYS = ("gpu_memory_utilization", "cpu_kvcache_space", "max_num_batched_tokens")


def engine_section(engine) -> dict:
    """What of `engine` the paths depend on (for the bank's key)."""
    return {k: v for k, v in plain(engine).items() if k not in ENGINE_MEMORY_KEYS}


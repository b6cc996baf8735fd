"""Features: the tapped hidden states of the stored paths, a second artifact beside the
trace bank, made by a teacher-forced forward over each path's tokens (the featurize stage,
stopexp/stages/featurize.py) or tapped inside the engine while collect generates them
(stopexp/store/tapped_features.py).

The extraction (`stopexp.models.extract`) reads, per path, the tapped state of the token
that fed generated token c at each position c, as the decode engine's taps do. A path is
alive at c when its length exceeds c; only such positions are kept.

    <cache>/features/<hash(bank key, tap layers, pooling, attention heads, positions, dtype)>

Positions (`tap.positions`): tap.checkpoints, further checkpoints, every `stride` tokens
and the tokens that end a reasoning step (`step_ends`: the task's `step_separator`).
Per path the artifact holds its positions and a (positions, layers, H) array (float32 or
float16) plus, with tap.attention_heads, the attention entropy per position. Shards mirror
the bank's, each written atomically with its record; `meta.json` records the tap, the
positions, what the bank shards were, and the shards' files (integrity as the bank's).

`tensors_at` and `position_batch` join a bank split with its features into predictor
batches; the confidence columns are computed from the bank's per-token arrays by
`stopexp.signals.columns.signal_matrix` with prefix = position, as online pruning does.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from datasets import Array3D, Features, List, Value

from stopexp.core.commands import make_with, stage_command
from stopexp.core.errors import ConfigError
from stopexp.core.protocol import attention_heads, checkpoint_tokens, resolve_layers
from stopexp.models import load_lm
from stopexp.runtime.artifacts import config_hash, plain
from stopexp.signals.feature_spec import SIGNAL_NAMES, FeatureSpec
from stopexp.store import bank
from stopexp.store.keys import BankSpec, numerics_section
from stopexp.tasks import build_task

log = logging.getLogger(__name__)


FEATURES_VERSION = 1


KIND = "features"


# ---- what the features are ---------------------------------------------------------------
@dataclass(frozen=True)
class FeatureSet:
    """The features of one trace bank under one tap: where they live and what they hold;
    a stage builds it once (stopexp.stages.build.feature_set, from `feature_set`)."""
    bank: BankSpec
    root: Path                 # <cache>/features/<feature_key>
    tap: Any                   # the tap section: layers, pooling, attention heads, dtype
    positions: dict            # position_spec
    group_window: int          # search.group_window (the confidence columns)
    max_batch_rows: int        # search.max_batch_rows
    max_batch_tokens: int | None  # model.max_batch_tokens
    load_lm: Callable          # () -> (model, tokenizer), called only when a shard is computed
    in_engine: bool = False    # collect taps them in the engine (else featurize's forward makes them)
    # the HF model's dtype and device kind where featurize's forward makes them and they are
    # not a CPU's float32 (stopexp.store.keys.numerics_section); None: the bank's key says them
    numerics: dict | None = None

    @property
    def key(self) -> str:
        return self.root.name


def feature_set(bank_spec: BankSpec, *, tap, search, model, task, cache_dir,
                in_engine: bool = False) -> FeatureSet:
    """The FeatureSet of `bank_spec` under the `tap` section, read from the LM of `model`
    (weights cached under `cache_dir`) at the positions of `tap`, `search` and `task`;
    `in_engine`: collect's engine taps them while it generates."""
    positions = position_spec(tap, search.max_new_tokens, task, model.get("thinking"))
    numerics = None if in_engine else numerics_section(model)
    return FeatureSet(bank_spec, Path(cache_dir) / "features" /
                      feature_key(bank_spec.key, tap, positions, numerics),
                      tap, positions, search.group_window, search.max_batch_rows,
                      model.max_batch_tokens, functools.partial(load_lm, model, cache_dir, task, tap),
                      in_engine, numerics)


def position_spec(tap, max_new_tokens: int, task, thinking=None) -> dict:
    """The positions the features hold, as recorded and hashed: the checkpoints in tokens
    (tap.checkpoints with tap.positions.checkpoints), the stride (None: none) and the step
    separator of the `task` section (None: step ends off; the task is built only then)."""
    pos, m = tap.positions, max_new_tokens
    checkpoints = sorted({checkpoint_tokens(c, m) for c in [*tap.checkpoints, *pos.checkpoints]})
    separator = None
    if pos.step_ends:
        separator = build_task(task, thinking).step_separator
        if not separator:  # validate refuses it first (stopexp.config.cross.step_ends_need_a_separator)
            raise ConfigError(f"tap.positions.step_ends: task {task.name} has no step separator")
    return {"checkpoints": checkpoints, "stride": pos.stride, "separator": separator}


def feature_key(bank_key: str, tap, positions: dict, numerics: dict | None = None) -> str:
    """What the features depend on: the bank they are made from, the tap and, where not
    None, the numerics of the forward that makes them (FeatureSet.numerics)."""
    heads = tap.get("attention_heads")
    taps = {"layers": list(tap.layers), "pooling": tap.pooling,
            "attention_heads": heads if heads is None or isinstance(heads, str) else list(heads),
            "positions": positions, "dtype": tap.positions.dtype}
    key = {"version": FEATURES_VERSION, "bank": bank_key, "tap": plain(taps)}
    return config_hash({**key, "numerics": numerics} if numerics is not None else key)


def feature_spec(meta: dict) -> FeatureSpec:
    """What a predictor is built for, from a features meta.json."""
    return FeatureSpec(meta["model_name"], meta["hidden_size"], list(meta["tap_layers"]),
                       tuple(meta["signal_names"]))


def spec_of(tap_layers, bank_meta: dict) -> FeatureSpec:
    """What a predictor on `tap_layers` (tap.layers) is built for, from the bank's record of
    the LM (its name, width and depth): no features needed (online evaluate)."""
    return FeatureSpec(bank_meta["model_name"], bank_meta["hidden_size"],
                       resolve_layers(list(tap_layers), bank_meta["num_layers"]), SIGNAL_NAMES)


def expected_meta(feats: FeatureSet, bank_meta: dict) -> dict:
    """What the features `feats` must record, from the config and the bank's record of the
    LM (its name, width, depth and Monte Carlo checkpoints). Attention heads are checked
    when listed: "all" is every head of the LM, which only the loaded model knows (the key
    covers it)."""
    tap = feats.tap
    layers = list(tap.layers)
    want = {"tap_layers": resolve_layers(layers, bank_meta["num_layers"]),
            "hidden_size": bank_meta["hidden_size"], "pooling": tap.pooling}
    heads = tap.get("attention_heads")
    if heads != "all":
        want["attention_heads"] = [list(h) for h in attention_heads(heads, layers, bank_meta["num_layers"], None)]
    return {**want, "positions": feats.positions, "dtype": tap.positions.dtype,
            "model_name": bank_meta["model_name"], "signal_names": list(SIGNAL_NAMES),
            "group_window": feats.group_window,
            "mc_checkpoints": list(bank_meta.get("checkpoints", [])),
            "bank": feats.bank.key, "key": feats.key}


TAP_INFO = ("tap_layers", "hidden_size", "attention_heads")  # measured on the loaded LM


def feature_columns(n_layers: int, hidden: int, dtype: str) -> Features:
    return Features({
        "split": Value("string"), "prompt_id": Value("int32"), "path_id": Value("int32"),
        "length": Value("int32"), "positions": List(Value("int32")),
        "hidden": Array3D(shape=(None, n_layers, hidden), dtype=dtype),
        "attn": List(Value("float32")),
    })


def shape_problem(hidden_column, shape: tuple[int, int]) -> str | None:
    """Why a features shard's hidden-state column (its `datasets` feature) does not hold
    `shape` (layers, width) per position, or None: what every reader and featurize's
    keeping of a shard check, since a shard of another tap or LM can carry consistent
    digests."""
    found = tuple(getattr(hidden_column, "shape", (None, *shape)))[1:]
    if found == tuple(shape):
        return None
    return (f"holds hidden states of {found[0]} x {found[1]} per position, the artifact "
            f"{shape[0]} x {shape[1]}")


# ---- the artifact ------------------------------------------------------------------------
def repair_text(overrides: list[str] | None = None) -> str:
    return (f"{stage_command('featurize', overrides)} (it recomputes only the damaged, missing or "
            "misfitting shards, from the trace bank, and rewrites meta.json; the pipeline does too)")


def summarize_features(out: Path, meta: dict, wall_s: float) -> dict:
    rows = sum(r["rows"] for r in meta["shards"].values())
    positions = sum(r.get("positions", 0) for r in meta["shards"].values())
    size = sum(f["size"] for r in meta["shards"].values() for f in r["files"].values())
    return {"features": str(out), "paths": rows, "positions": positions, "bytes": size,
            "shards": len(meta["shards"]),
            "tapped_shards": sum(1 for r in meta["shards"].values() if "tapped" in r),
            "tap_layers": meta["tap_layers"], "wall_s": round(wall_s, 2),
            "nonfinite_features": sum(r.get("nonfinite", 0) for r in meta["shards"].values())}


def old_meta(out: Path) -> dict | None:
    """The features' meta.json as it is, or None when missing or unreadable."""
    try:
        return bank.read_meta(out, kind=KIND)
    except bank.BankMissing:
        return None


def is_complete(out: Path) -> bool:
    """Whether the features at `out` have a meta.json that says they are complete."""
    meta = old_meta(out)
    return bool(meta and meta.get("complete"))


def require_features(feats: FeatureSet, overrides: list[str] | None = None) -> Path:
    """The features `feats`, verified (cheaply) against their record, and their record
    against the config and the trace bank's (`expected_meta`). Missing ones raise
    BankMissing with the featurize command that makes them; damaged ones BankDamaged naming
    the shard and file, misfitting ones ArtifactMismatch naming the field, each with the
    command that repairs them."""
    out = feats.root
    repair = repair_text(overrides)
    broot = bank.require_bank(feats.bank, overrides)
    if not (out / "meta.json").exists() or not bank.read_meta(out, repair, KIND).get("complete"):
        raise bank.BankMissing(f"no features for this config at {out}; "
                               + make_with("featurize", overrides, "them"))
    meta = bank.verify_bank(out, repair=repair, kind=KIND, version=FEATURES_VERSION)
    bmeta = bank.read_meta(broot)
    bank.check_fit(KIND, out, meta, expected_meta(feats, bmeta), repair)
    stale = [n for n, rec in meta["shards"].items()
             if rec.get("bank_files") != bmeta["shards"].get(n, {}).get("files")]
    if stale or set(meta["shards"]) != set(bmeta["shards"]):
        raise bank.BankDamaged(f"features {out} were made from another copy of the trace bank "
                               f"{broot} (shards {bank.brief(sorted(stale))} differ); repair: {repair}")
    return out

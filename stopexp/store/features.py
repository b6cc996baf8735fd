"""Features: the tapped hidden states of the stored paths, a second artifact beside the
trace bank, made by a teacher-forced forward over each path's tokens.

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
Concurrent featurizers of the same features take turns under their lock
(`stopexp.runtime.artifacts.artifact_lock`): the first computes, the others keep its shards.

`tensors_at` and `position_batch` join a bank split with its features into predictor
batches; the confidence columns are computed from the bank's per-token arrays by
`stopexp.signals.columns.signal_matrix` with prefix = position, as online pruning does.
"""
from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
from datasets import Array3D, Features, List, Value, load_from_disk

from stopexp.core.errors import ConfigError
from stopexp.core.protocol import attention_heads, checkpoint_tokens, resolve_layers
from stopexp.models import load_lm
from stopexp.models.extract import DEFAULT_BATCH_TOKENS, StepEnds, extract, path_positions
from stopexp.runtime.artifacts import artifact_lock, config_hash, plain
from stopexp.runtime.integrity import set_aside
from stopexp.search.sample import prompt_ids
from stopexp.search.taps import Taps
from stopexp.signals.features import SIGNAL_NAMES, FeatureSpec
from stopexp.store import bank
from stopexp.store.keys import BankSpec
from stopexp.tasks import build_task

log = logging.getLogger(__name__)


FEATURES_VERSION = 1


KIND = "features"


# ---- what the features are ---------------------------------------------------------------
@dataclass(frozen=True)
class FeatureSet:
    """The features of one trace bank under one tap: where they live and what they hold;
    a stage builds it once (stopexp.stages.build.features, from `feature_set`)."""
    bank: BankSpec
    root: Path                 # <cache>/features/<feature_key>
    tap: Any                   # the tap section: layers, pooling, attention heads, dtype
    positions: dict            # position_spec
    group_window: int          # search.group_window (the confidence columns)
    max_batch_rows: int        # search.max_batch_rows
    max_batch_tokens: int | None  # model.max_batch_tokens
    load_lm: Callable          # () -> (model, tokenizer), called only when a shard is computed

    @property
    def key(self) -> str:
        return self.root.name


def feature_set(bank_spec: BankSpec, *, tap, search, model, task, cache_dir) -> FeatureSet:
    """The FeatureSet of `bank_spec` under the `tap` section, read from the LM of `model`
    (weights cached under `cache_dir`) at the positions of `tap`, `search` and `task`."""
    positions = position_spec(tap, search.max_new_tokens, task, model.get("thinking"))
    return FeatureSet(bank_spec, Path(cache_dir) / "features" / feature_key(bank_spec.key, tap, positions),
                      tap, positions, search.group_window, search.max_batch_rows,
                      model.max_batch_tokens, functools.partial(load_lm, model, cache_dir, task, tap))


def position_spec(tap, max_new_tokens: int, task, thinking=None) -> dict:
    """The positions the features hold, as recorded and hashed: the checkpoints in tokens
    (tap.checkpoints with tap.positions.checkpoints), the stride (None: none) and the step
    separator of the `task` section (None: step ends off; the task is built only then)."""
    pos, m = tap.positions, max_new_tokens
    checkpoints = sorted({checkpoint_tokens(c, m) for c in [*tap.checkpoints, *pos.checkpoints]})
    separator = None
    if pos.step_ends:
        separator = getattr(build_task(task, thinking), "step_separator", None)
        if not separator:  # validate refuses it first (stopexp.config.cross.step_ends_need_a_separator)
            raise ConfigError(f"tap.positions.step_ends: task {task.name} has no step separator")
    return {"checkpoints": checkpoints, "stride": pos.stride, "separator": separator}


def feature_key(bank_key: str, tap, positions: dict) -> str:
    """What the features depend on: the bank they are made from and the tap."""
    heads = tap.get("attention_heads")
    taps = {"layers": list(tap.layers), "pooling": tap.pooling,
            "attention_heads": heads if heads is None or isinstance(heads, str) else list(heads),
            "positions": positions, "dtype": tap.positions.dtype}
    return config_hash({"version": FEATURES_VERSION, "bank": bank_key, "tap": plain(taps)})


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


def columns(n_layers: int, hidden: int, dtype: str) -> Features:
    return Features({
        "split": Value("string"), "prompt_id": Value("int32"), "path_id": Value("int32"),
        "length": Value("int32"), "positions": List(Value("int32")),
        "hidden": Array3D(shape=(None, n_layers, hidden), dtype=dtype),
        "attn": List(Value("float32")),
    })


# ---- the artifact ------------------------------------------------------------------------
def featurize_command(overrides: list[str] | None = None) -> str:
    return f"python -m stopexp.featurize {' '.join(overrides or [])}".rstrip()


def repair_text(overrides: list[str] | None = None) -> str:
    return (f"{featurize_command(overrides)} (it recomputes only the damaged, missing or "
            "misfitting shards, from the trace bank, and rewrites meta.json; python -m "
            "stopexp.pipeline does too)")


def featurize(feats: FeatureSet, overrides: list[str] | None = None, run=None) -> dict:
    """Make (or complete, or repair) the features `feats` from their trace bank; returns a
    summary. Shards already there and matching their record byte for byte, made from the
    current bank shard for these features, are kept; damaged, stale or misfitting ones
    (made for other features: their record names them) are set aside and recomputed, and a
    meta.json that does not fit the config is rewritten. The LM is loaded only when a shard
    must be computed. BankMissing when there is no bank; ArtifactMismatch when what the LM
    gave differs from the bank's record of it. Concurrent featurizers of the same features
    take turns (`artifact_lock`): the later ones find the first one's shards and keep them."""
    out = feats.root
    with artifact_lock(out):
        summary = _make(feats, overrides)
    if summary.get("tapped_shards"):
        log.info("features %s: %d of %d shards were tapped while collect generated them",
                 out, summary["tapped_shards"], summary["shards"])
    if run is not None:
        run.summary_update({f"featurize/{k}": v for k, v in summary.items() if k != "tap_layers"})
        run.log_artifact(out, name=f"features-{out.name}", type="features",
                         metadata={"bank": feats.bank.root.name, **summary})
    return summary


def _make(feats: FeatureSet, overrides: list[str] | None) -> dict:
    """`featurize` under the features' lock: keep, set aside, compute, write meta.json."""
    root = bank.require_bank(feats.bank, overrides)
    bmeta = bank.read_meta(root)
    out = feats.root
    want = expected_meta(feats, bmeta)
    old = _old_meta(out)
    problem = bank.misfit(old, want) if old is not None else None
    # shards written before they recorded their features are trusted by a meta.json that fits
    legacy = out.name if old is not None and problem is None else None
    good, todo = {}, []
    for name in sorted(bmeta["shards"]):
        rec = bank.read_record(out / name) if (out / name).is_dir() else None
        fresh = rec is not None and rec.get("bank_files") == bmeta["shards"][name]["files"] \
            and rec.get("features", legacy) == out.name
        if fresh and bank.shard_problem(out / name, full=True) is None:
            good[name] = rec
            continue
        if (out / name).exists():
            log.warning("features %s: shard %s is damaged, was made from another bank shard or for "
                        "other features; set aside, it is recomputed", out, name)
            set_aside(out / name)
        todo.append(name)
    start = time.time()
    if not todo and old is not None and problem is None:
        try:
            return summarize_features(out, bank.verify_bank(out, kind=KIND, version=FEATURES_VERSION), 0.0)
        except bank.BankMissing:
            pass
    if problem:
        log.warning("features %s: %s; meta.json is rewritten", out, problem)
    info = _fill(feats, root, todo, bmeta, good) if todo else \
        _tap_info(good, old if legacy else None, feats.tap, bmeta)
    meta = _write_meta(feats, root, bmeta, good, info)
    bank.check_fit(KIND, out, meta, want, repair_text(overrides))  # the LM is the bank's
    return summarize_features(out, meta, time.time() - start)


def _old_meta(out: Path) -> dict | None:
    """The features' meta.json as it is, or None when missing or unreadable."""
    try:
        return bank.read_meta(out, kind=KIND)
    except bank.BankMissing:
        return None


def _tap_info(good: dict, old: dict | None, tap, bmeta: dict) -> dict:
    """The tap as measured on the LM, when no shard is computed now: from a kept shard's
    record, else from the old meta.json (`old`, when it fits), else from the config and the
    bank's record (a bank of empty shards)."""
    for rec in good.values():
        if all(k in rec for k in TAP_INFO):
            return {k: rec[k] for k in TAP_INFO}
    return {k: old[k] for k in TAP_INFO} if old is not None else _model_info(tap, bmeta)


def _model_info(tap, bmeta: dict) -> dict:
    """What the meta records of the tap without loading the LM (a bank of empty shards)."""
    layers = resolve_layers(list(tap.layers), bmeta["num_layers"])
    return {"tap_layers": layers, "hidden_size": bmeta["hidden_size"],
            "attention_heads": [list(h) for h in attention_heads(
                tap.get("attention_heads"), list(tap.layers), bmeta["num_layers"], None)]}


def _fill(feats: FeatureSet, root: Path, todo: list[str], bmeta: dict, good: dict) -> dict:
    """Compute the `todo` shards with the LM; records go into `good`."""
    from tqdm import tqdm

    out, spec, tap = feats.root, feats.positions, feats.tap
    log.info("extracting features of %d bank shards into %s (teacher-forced forward, loads the LM)",
             len(todo), out)
    model, tokenizer = feats.load_lm()
    step_end = StepEnds(tokenizer, spec["separator"])
    budget = feats.max_batch_tokens or DEFAULT_BATCH_TOKENS
    encoded: dict[str, list[int]] = {}
    with Taps(model, list(tap.layers), tap.pooling, tap.get("attention_heads"),
              sequence=True) as taps:
        hidden = model.config.get_text_config().hidden_size
        schema = columns(len(taps.layers), hidden, tap.positions.dtype)
        info = {"tap_layers": list(taps.layers), "hidden_size": hidden,
                "attention_heads": [list(h) for h in taps.heads]}
        for name in tqdm(todo, desc="featurize", unit="shard"):
            shard_start = time.time()
            rows = _bank_shard(root, name)
            seqs = []
            for r in range(len(rows["length"])):
                prompt = rows["prompt"][r]
                if prompt not in encoded:
                    encoded[prompt] = prompt_ids(tokenizer, prompt)
                ids = encoded[prompt]
                if len(ids) != rows["prompt_len"][r]:
                    raise bank.BankDamaged(
                        f"trace bank {root}: shard {name} row {r}: the prompt encodes to {len(ids)} "
                        f"tokens now, {rows['prompt_len'][r]} when collected (another tokenizer or "
                        f"chat template?); repair: {bank.REPAIR}")
                seqs.append((ids, rows["tokens"][r], path_positions(rows["tokens"][r], spec, step_end)))
            got = extract(model, taps, seqs, tokenizer.pad_token_id, budget, feats.max_batch_rows)
            n_layers = len(taps.layers)
            cols = {k: list(rows[k]) for k in ("split", "prompt_id", "path_id", "length")}
            cols["positions"] = [s[2] for s in seqs]
            cols["hidden"] = [h if len(pos) else np.zeros((0, n_layers, hidden), np.float32)
                              for (h, _), (_, _, pos) in zip(got, seqs)]
            cols["attn"] = [a if a is not None else np.zeros(0, np.float32) for _, a in got]
            rec = bank.write_shard(out, name, cols, schema, {
                "features": out.name, **info,
                "bank_files": bmeta["shards"][name]["files"], "seconds": time.time() - shard_start,
                "positions": int(sum(map(len, cols["positions"]))),
                "nonfinite": int(sum((~np.isfinite(h)).sum() for h in cols["hidden"]))})
            good[name] = rec
    return info


def _bank_shard(root: Path, name: str) -> dict:
    """One bank shard's columns that extraction needs (empty lists for an empty shard)."""
    keys = ("split", "prompt_id", "path_id", "length", "prompt", "prompt_len", "tokens")
    if not (root / name / "dataset_info.json").exists():
        return {k: [] for k in keys}
    table = load_from_disk(str(root / name)).data  # whole columns: a Column read row by row is slow
    return {k: table.column(k).to_pylist() for k in keys}


def _write_meta(feats: FeatureSet, root: Path, bmeta: dict, good: dict, info: dict) -> dict:
    out = feats.root
    missing = [n for n in sorted(bmeta["shards"]) if n not in good]
    seconds = sum(r.get("seconds", 0.0) for r in good.values())
    meta = {"key": out.name, "bank": root.name, "version": FEATURES_VERSION,
            "complete": not missing, "model_name": bmeta["model_name"], **info,
            "pooling": feats.tap.pooling, "positions": feats.positions, "dtype": feats.tap.positions.dtype,
            "signal_names": list(SIGNAL_NAMES), "group_window": feats.group_window,
            "mc_checkpoints": list(bmeta.get("checkpoints", [])),
            "plan": [{"index": i, "name": n} for i, n in enumerate(sorted(bmeta["shards"]))],
            "shards": good, "seconds": seconds, **({"missing": missing} if missing else {})}
    bank.write_meta(out, meta)
    return meta


def summarize_features(out: Path, meta: dict, wall_s: float) -> dict:
    rows = sum(r["rows"] for r in meta["shards"].values())
    positions = sum(r.get("positions", 0) for r in meta["shards"].values())
    size = sum(f["size"] for r in meta["shards"].values() for f in r["files"].values())
    return {"features": str(out), "paths": rows, "positions": positions, "bytes": size,
            "shards": len(meta["shards"]),
            "tapped_shards": sum(1 for r in meta["shards"].values() if "tapped" in r),
            "tap_layers": meta["tap_layers"], "wall_s": round(wall_s, 2),
            "nonfinite_features": sum(r.get("nonfinite", 0) for r in meta["shards"].values())}


def is_complete(out: Path) -> bool:
    """Whether the features at `out` have a meta.json that says they are complete."""
    meta = _old_meta(out)
    return bool(meta and meta.get("complete"))


def require_features(feats: FeatureSet, overrides: list[str] | None = None, make: bool = True) -> Path:
    """The features `feats`, verified (cheaply) against their record, and their record
    against the config and the trace bank's (`expected_meta`). Missing ones are made from
    the trace bank when `make` (a log line says so; the LM loads only then), else
    BankMissing gives the featurize command; damaged ones raise BankDamaged naming the
    shard and file, misfitting ones ArtifactMismatch naming the field, each with the
    command that repairs them."""
    out = feats.root
    repair = repair_text(overrides)
    broot = bank.require_bank(feats.bank, overrides)
    if not (out / "meta.json").exists() or not bank.read_meta(out, repair, KIND).get("complete"):
        if not make:
            raise bank.BankMissing(f"no features for this config at {out}; make them with: "
                                   f"{featurize_command(overrides)}")
        log.info("no features for this config at %s: extracting them from the trace bank "
                 "(python -m stopexp.featurize)", out)
        featurize(feats, overrides)
    meta = bank.verify_bank(out, repair=repair, kind=KIND, version=FEATURES_VERSION)
    bmeta = bank.read_meta(broot)
    bank.check_fit(KIND, out, meta, expected_meta(feats, bmeta), repair)
    stale = [n for n, rec in meta["shards"].items()
             if rec.get("bank_files") != bmeta["shards"].get(n, {}).get("files")]
    if stale or set(meta["shards"]) != set(bmeta["shards"]):
        raise bank.BankDamaged(f"features {out} were made from another copy of the trace bank "
                               f"{broot} (shards {bank.brief(sorted(stale))} differ); repair: {repair}")
    return out

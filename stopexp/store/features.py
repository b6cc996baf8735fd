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

import numpy as np
import torch
from datasets import Array3D, Features, List, Value, load_from_disk

from stopexp.store import bank
from stopexp.runtime.artifacts import config_hash, plain
from stopexp.config import checkpoint_tokens
from stopexp.core.errors import ConfigError, error_text
from stopexp.models.extract import DEFAULT_BATCH_TOKENS, StepEnds, extract, path_positions
from stopexp.runtime.integrity import set_aside
from stopexp.signals.features import SIGNAL_NAMES, FeatureSpec

log = logging.getLogger(__name__)

FEATURES_VERSION = 1
KIND = "features"


# ---- what the features are ---------------------------------------------------------------

def position_spec(cfg, task=None) -> dict:
    """The positions the features hold, as recorded and hashed: the checkpoints in tokens
    (tap.checkpoints with tap.positions.checkpoints), the stride (None: none) and the step
    separator (None: step ends off)."""
    pos, m = cfg.tap.positions, cfg.search.max_new_tokens
    checkpoints = sorted({checkpoint_tokens(c, m) for c in [*cfg.tap.checkpoints, *pos.checkpoints]})
    separator = None
    if pos.step_ends:
        if task is None:
            from stopexp.tasks import build_task
            task = build_task(cfg.task)
        separator = getattr(task, "step_separator", None)
        if not separator:  # validate refuses it first (config._check_step_ends)
            raise ConfigError(f"tap.positions.step_ends: task {cfg.task.name} has no step separator")
    return {"checkpoints": checkpoints, "stride": pos.stride, "separator": separator}


def feature_key(cfg) -> str:
    """What the features depend on: the bank they are made from and the tap."""
    heads = cfg.tap.get("attention_heads")
    tap = {"layers": list(cfg.tap.layers), "pooling": cfg.tap.pooling,
           "attention_heads": heads if heads is None or isinstance(heads, str) else list(heads),
           "positions": position_spec(cfg), "dtype": cfg.tap.positions.dtype}
    return config_hash({"version": FEATURES_VERSION, "bank": bank.bank_key(cfg), "tap": plain(tap)})


def features_dir(cfg) -> Path:
    return Path(cfg.paths.cache_dir) / "features" / feature_key(cfg)


def feature_spec(meta: dict) -> FeatureSpec:
    """What a predictor is built for, from a features meta.json."""
    return FeatureSpec(meta["model_name"], meta["hidden_size"], list(meta["tap_layers"]),
                       tuple(meta["signal_names"]))


def spec_of(cfg, bank_meta: dict) -> FeatureSpec:
    """What a predictor of `cfg` is built for, from the bank's record of the LM (its name,
    width and depth) and tap.layers: no features needed (online evaluate)."""
    from stopexp.config import resolve_layers

    return FeatureSpec(bank_meta["model_name"], bank_meta["hidden_size"],
                       resolve_layers(list(cfg.tap.layers), bank_meta["num_layers"]), SIGNAL_NAMES)


def expected_meta(cfg, bank_meta: dict, out: Path, positions: dict | None = None) -> dict:
    """What the features of `cfg` at `out` must record, from the config and the bank's
    record of the LM (its name, width, depth and Monte Carlo checkpoints); `positions`:
    `position_spec(cfg)`. Attention heads are checked when listed: "all" is every head of
    the LM, which only the loaded model knows (the key covers it)."""
    from stopexp.config import attention_heads, resolve_layers

    layers = list(cfg.tap.layers)
    want = {"tap_layers": resolve_layers(layers, bank_meta["num_layers"]),
            "hidden_size": bank_meta["hidden_size"], "pooling": cfg.tap.pooling}
    heads = cfg.tap.get("attention_heads")
    if heads != "all":
        want["attention_heads"] = [list(h) for h in attention_heads(heads, layers, bank_meta["num_layers"], None)]
    return {**want, "positions": positions or position_spec(cfg), "dtype": cfg.tap.positions.dtype,
            "model_name": bank_meta["model_name"], "signal_names": list(SIGNAL_NAMES),
            "group_window": cfg.search.group_window,
            "mc_checkpoints": list(bank_meta.get("checkpoints", [])),
            "bank": bank.bank_key(cfg), "key": out.name}


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


def featurize(cfg, overrides: list[str] | None = None, run=None) -> dict:
    """Make (or complete, or repair) the features of `cfg` from its trace bank; returns a
    summary. Shards already there and matching their record byte for byte, made from the
    current bank shard for these features, are kept; damaged, stale or misfitting ones
    (made for other features: their record names them) are set aside and recomputed, and a
    meta.json that does not fit the config is rewritten. The LM is loaded only when a shard
    must be computed. BankMissing when there is no bank; ArtifactMismatch when what the LM
    gave differs from the bank's record of it."""
    from stopexp.tasks import build_task

    root = bank.require_bank(cfg, overrides)
    bmeta = bank.read_meta(root)
    out = features_dir(cfg)
    spec = position_spec(cfg, build_task(cfg.task))
    want = expected_meta(cfg, bmeta, out, spec)
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
            return summarize(out, bank.verify_bank(out, kind=KIND, version=FEATURES_VERSION), 0.0)
        except bank.BankMissing:
            pass
    if problem:
        log.warning("features %s: %s; meta.json is rewritten", out, problem)
    info = _fill(cfg, root, out, todo, bmeta, spec, good) if todo else \
        _tap_info(good, old if legacy else None, cfg, bmeta)
    meta = _write_meta(cfg, out, root, bmeta, spec, good, info)
    bank.check_fit(KIND, out, meta, want, repair_text(overrides))  # the LM is the bank's
    summary = summarize(out, meta, time.time() - start)
    if run is not None:
        run.summary_update({f"featurize/{k}": v for k, v in summary.items() if k != "tap_layers"})
        run.log_artifact(out, name=f"features-{out.name}", type="features",
                         metadata={"bank": root.name, **summary})
    return summary


def _old_meta(out: Path) -> dict | None:
    """The features' meta.json as it is, or None when missing or unreadable."""
    try:
        return bank.read_meta(out, kind=KIND)
    except bank.BankMissing:
        return None


def _tap_info(good: dict, old: dict | None, cfg, bmeta: dict) -> dict:
    """The tap as measured on the LM, when no shard is computed now: from a kept shard's
    record, else from the old meta.json (`old`, when it fits), else from the config and the
    bank's record (a bank of empty shards)."""
    for rec in good.values():
        if all(k in rec for k in TAP_INFO):
            return {k: rec[k] for k in TAP_INFO}
    return {k: old[k] for k in TAP_INFO} if old is not None else _model_info(cfg, bmeta)


def _model_info(cfg, bmeta: dict) -> dict:
    """What the meta records of the tap without loading the LM (a bank of empty shards)."""
    from stopexp.config import attention_heads, resolve_layers

    layers = resolve_layers(list(cfg.tap.layers), bmeta["num_layers"])
    return {"tap_layers": layers, "hidden_size": bmeta["hidden_size"],
            "attention_heads": [list(h) for h in attention_heads(
                cfg.tap.get("attention_heads"), list(cfg.tap.layers), bmeta["num_layers"], None)]}


def _fill(cfg, root: Path, out: Path, todo: list[str], bmeta: dict, spec: dict,
          good: dict) -> dict:
    """Compute the `todo` shards with the LM; records go into `good`."""
    from tqdm import tqdm

    from stopexp.models import load_lm
    from stopexp.search.sample import prompt_ids
    from stopexp.search.taps import Taps

    log.info("extracting features of %d bank shards into %s (teacher-forced forward, loads the LM)",
             len(todo), out)
    model, tokenizer = load_lm(cfg)
    step_end = StepEnds(tokenizer, spec["separator"])
    budget = cfg.model.max_batch_tokens or DEFAULT_BATCH_TOKENS
    encoded: dict[str, list[int]] = {}
    with Taps(model, list(cfg.tap.layers), cfg.tap.pooling, cfg.tap.get("attention_heads"),
              sequence=True) as taps:
        hidden = model.config.get_text_config().hidden_size
        feats = columns(len(taps.layers), hidden, cfg.tap.positions.dtype)
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
            got = extract(model, taps, seqs, tokenizer.pad_token_id, budget, cfg.search.max_batch_rows)
            n_layers = len(taps.layers)
            cols = {k: list(rows[k]) for k in ("split", "prompt_id", "path_id", "length")}
            cols["positions"] = [s[2] for s in seqs]
            cols["hidden"] = [h if len(pos) else np.zeros((0, n_layers, hidden), np.float32)
                              for (h, _), (_, _, pos) in zip(got, seqs)]
            cols["attn"] = [a if a is not None else np.zeros(0, np.float32) for _, a in got]
            rec = bank.write_shard(out, name, cols, feats, {
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


def _write_meta(cfg, out: Path, root: Path, bmeta: dict, spec: dict, good: dict,
                info: dict) -> dict:
    missing = [n for n in sorted(bmeta["shards"]) if n not in good]
    seconds = sum(r.get("seconds", 0.0) for r in good.values())
    meta = {"key": out.name, "bank": root.name, "version": FEATURES_VERSION,
            "complete": not missing, "model_name": bmeta["model_name"], **info,
            "pooling": cfg.tap.pooling, "positions": spec, "dtype": cfg.tap.positions.dtype,
            "signal_names": list(SIGNAL_NAMES), "group_window": cfg.search.group_window,
            "mc_checkpoints": list(bmeta.get("checkpoints", [])),
            "plan": [{"index": i, "name": n} for i, n in enumerate(sorted(bmeta["shards"]))],
            "shards": good, "seconds": seconds, **({"missing": missing} if missing else {})}
    bank.write_meta(out, meta)
    return meta


def summarize(out: Path, meta: dict, wall_s: float) -> dict:
    rows = sum(r["rows"] for r in meta["shards"].values())
    positions = sum(r.get("positions", 0) for r in meta["shards"].values())
    size = sum(f["size"] for r in meta["shards"].values() for f in r["files"].values())
    return {"features": str(out), "paths": rows, "positions": positions, "bytes": size,
            "tap_layers": meta["tap_layers"], "wall_s": round(wall_s, 2),
            "nonfinite_features": sum(r.get("nonfinite", 0) for r in meta["shards"].values())}


def require_features(cfg, overrides: list[str] | None = None, make: bool = True) -> Path:
    """The features of `cfg`, verified (cheaply) against their record, and their record
    against the config and the trace bank's (`expected_meta`). Missing ones are made from
    the trace bank when `make` (a log line says so; the LM loads only then), else
    BankMissing gives the featurize command; damaged ones raise BankDamaged naming the
    shard and file, misfitting ones ArtifactMismatch naming the field, each with the
    command that repairs them."""
    out = features_dir(cfg)
    repair = repair_text(overrides)
    broot = bank.require_bank(cfg, overrides)
    if not (out / "meta.json").exists() or not bank.read_meta(out, repair, KIND).get("complete"):
        if not make:
            raise bank.BankMissing(f"no features for this config at {out}; make them with: "
                                   f"{featurize_command(overrides)}")
        log.info("no features for this config at %s: extracting them from the trace bank "
                 "(python -m stopexp.featurize)", out)
        featurize(cfg, overrides)
    meta = bank.verify_bank(out, repair=repair, kind=KIND, version=FEATURES_VERSION)
    bmeta = bank.read_meta(broot)
    bank.check_fit(KIND, out, meta, expected_meta(cfg, bmeta, out), repair)
    stale = [n for n, rec in meta["shards"].items()
             if rec.get("bank_files") != bmeta["shards"].get(n, {}).get("files")]
    if stale or set(meta["shards"]) != set(bmeta["shards"]):
        raise bank.BankDamaged(f"features {out} were made from another copy of the trace bank "
                               f"{broot} (shards {bank.brief(sorted(stale))} differ); repair: {repair}")
    return out


# ---- reading -----------------------------------------------------------------------------

@dataclass
class PathFeatures:
    """The features of the rows of one bank split, in the bank's row order (flat arrays:
    the positions of row i are `positions[offsets[i]:offsets[i + 1]]`)."""
    meta: dict
    offsets: np.ndarray      # (R + 1,) int64
    positions: np.ndarray    # (total,) int64, generated tokens
    hidden: np.ndarray       # (total, layers, H), float32 or float16
    attn: np.ndarray         # (total,) float32 (zeros without the attention tap)
    keys: np.ndarray         # (R, 2) prompt id, path id: the join check
    splits: np.ndarray       # (R,) split of each row: the join check

    @property
    def rows(self) -> np.ndarray:
        """(total,) the row of each stored position."""
        return np.repeat(np.arange(len(self.offsets) - 1), np.diff(self.offsets))


def load_features(root: Path, split: str | None = None, repair: str | None = None) -> PathFeatures:
    """The features of the rows that `bank.load_bank(bank_root, split)` returns, in the
    same order, read-only. Raises BankMissing / BankDamaged naming the shard and file at
    fault. The artifact is verified on every call; its arrays are read once per version
    (meta.json) and split, since train and evaluate come back to a split for its curves."""
    root = Path(root)
    repair = repair or repair_text()
    bank.verify_bank(root, repair=repair, kind=KIND, version=FEATURES_VERSION)
    stamp = (root / "meta.json").stat()
    return _read_features(str(root.resolve()), split, repair, stamp.st_mtime_ns, stamp.st_size)


@functools.lru_cache(maxsize=3)
def _read_features(root: str, split: str | None, repair: str, _mtime_ns: int, _size: int
                   ) -> PathFeatures:
    """`load_features` after verification: the arrays of one version of the artifact."""
    root = Path(root)
    meta = bank.read_meta(root, repair, KIND)
    names = bank.shards_holding(meta, split)
    L, H = len(meta["tap_layers"]), meta["hidden_size"]
    counts, pos, hid, att, keys, splits = [], [], [], [], [], []
    for name in names:
        try:
            table = load_from_disk(str(root / name)).data
            n = table.num_rows
            p = table.column("positions").combine_chunks()
            h = table.column("hidden").combine_chunks()
            h = getattr(h, "storage", h)  # the extension array's list<list<list<float>>>
            flat = h.flatten().flatten().flatten().to_numpy(zero_copy_only=False)
            a = table.column("attn").combine_chunks()
        except Exception as e:  # pyarrow / datasets name no file: say which shard it was
            raise bank.BankDamaged(f"features {root}: shard {name} cannot be read "
                                   f"({error_text(e)}); repair: {repair}") from e
        if n != meta["shards"][name]["rows"]:
            raise bank.BankDamaged(f"features {root}: shard {name} holds {n} rows, "
                                   f"{meta['shards'][name]['rows']} recorded; repair: {repair}")
        counts.append(np.diff(p.offsets.to_numpy()))
        pos.append(p.flatten().to_numpy().astype(np.int64))
        hid.append(flat.reshape(-1, L, H))
        att_flat = a.flatten().to_numpy(zero_copy_only=False).astype(np.float32)
        att.append(att_flat if len(att_flat) else np.zeros(len(pos[-1]), np.float32))
        keys.append(np.stack([table.column("prompt_id").to_numpy(),
                              table.column("path_id").to_numpy()], 1).astype(np.int64))
        splits.append(np.asarray(table.column("split").to_pylist()))
    counts, positions = np.concatenate(counts), np.concatenate(pos)
    hidden, attn, keys, splits = np.concatenate(hid), np.concatenate(att), np.concatenate(keys), \
        np.concatenate(splits)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    if split is not None:  # keep the split's rows, as load_bank does
        take = np.nonzero(splits == split)[0]
        flat = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in take]) if len(take) \
            else np.zeros(0, np.int64)
        positions, hidden, attn = positions[flat], hidden[flat], attn[flat]
        offsets = np.concatenate([[0], np.cumsum(counts[take])]).astype(np.int64)
        keys, splits = keys[take], splits[take]
    for array in (offsets, positions, hidden, attn, keys, splits):
        array.flags.writeable = False  # shared by every caller of this version and split
    return PathFeatures(meta, offsets, positions, hidden, attn, keys, splits)


def _check_join(ds, feats: PathFeatures) -> None:
    keys = np.stack([np.asarray(ds["prompt_id"][:]), np.asarray(ds["path_id"][:])], 1)
    if keys.shape != feats.keys.shape or not (keys == feats.keys).all() or \
            not (np.asarray(ds["split"][:]) == feats.splits).all():
        raise ValueError(f"the features ({len(feats.keys)} paths) are not those of this bank split "
                         f"({len(keys)} paths): load both with the same split, from the bank "
                         "the features were made from")


def _token_arrays(ds):
    """(R, T) zero-padded per-token log-prob, entropy, confidence of the bank's rows."""
    cols = [ds[k][:] for k in ("token_logprob", "token_entropy", "token_conf")]
    length = np.asarray(ds["length"][:])
    T = max(1, int(length.max()) if len(length) else 1)
    out = [np.zeros((len(length), T), np.float32) for _ in cols]
    for arr, col in zip(out, cols):
        for i, v in enumerate(col):
            arr[i, : len(v)] = v
    return [torch.from_numpy(a) for a in out]


def _groups(ds) -> np.ndarray:
    splits, prompt_ids = np.asarray(ds["split"][:]), np.asarray(ds["prompt_id"][:])
    keys = np.char.add(np.char.add(splits.astype(str), "/"), prompt_ids.astype(str))
    return np.unique(keys, return_inverse=True)[1].astype(np.int64)


def _mc(ds, feats: PathFeatures, rows: np.ndarray, positions: np.ndarray,
        reward: np.ndarray, alive: np.ndarray) -> np.ndarray:
    """The Monte Carlo label of each (row, position): the bank's mean rollout reward at its
    Monte Carlo checkpoints, NaN elsewhere while alive, the path's own reward once it
    ended (its outcome with reward=correct)."""
    mc = np.full(len(rows), np.nan, np.float32)
    where = list(feats.meta.get("mc_checkpoints", []))
    if where and len(rows):
        rates = np.asarray(ds["mc"][:], dtype=np.float32).reshape(len(ds), len(where))
        for j, c in enumerate(where):
            at = positions == c
            mc[at] = rates[rows[at], j]
    mc[~alive] = reward[rows][~alive]
    return mc


def tensors_at(ds, feats: PathFeatures, checkpoint: int) -> dict:
    """Everything a predictor or a pruning decision needs at prefix `checkpoint` (tokens),
    for every path of `ds` (a numpy-formatted bank split) joined with its features `feats`
    (`load_features` of the same split), as float32/int64 torch tensors: "hidden" (R,
    layers, H), "signals" (R, S), "group", "correct", "reward", "mc", "alive" (bool),
    "prefix_len", "remaining", "length" (R,). Rows not alive at the checkpoint have zero hidden states
    (their confidence columns cover the whole path). ValueError when an alive path's
    features lack the position (it is not among tap.checkpoints / tap.positions)."""
    _check_join(ds, feats)
    R = len(ds)
    length = np.asarray(ds["length"][:]).astype(np.int64)
    alive = length > checkpoint
    at = np.nonzero(feats.positions == checkpoint)[0]
    rows = feats.rows[at]
    if alive.sum() != len(rows):
        raise ValueError(f"the features hold no position {checkpoint} for some paths alive there; "
                         f"they hold the checkpoints {feats.meta['positions']['checkpoints']}, "
                         f"stride {feats.meta['positions']['stride']}: add it to tap.checkpoints "
                         "or tap.positions")
    L, H = feats.hidden.shape[1:] if feats.hidden.ndim == 3 else (len(feats.meta["tap_layers"]),
                                                                  feats.meta["hidden_size"])
    hidden = np.zeros((R, L, H), np.float32)
    hidden[rows] = feats.hidden[at]
    attn = np.zeros(R, np.float32)
    attn[rows] = feats.attn[at]
    prefix = np.minimum(length, checkpoint)
    correct = np.asarray(ds["correct"][:]).astype(np.float32)
    reward = bank.rewards_of(ds)
    signals = _signals(ds, None, prefix, hidden, attn, feats)
    mc = _mc(ds, feats, np.arange(R), np.full(R, checkpoint), reward, alive)
    return {
        "hidden": torch.from_numpy(hidden), "signals": signals,
        "group": torch.from_numpy(_groups(ds)),
        "correct": torch.from_numpy(correct), "reward": torch.from_numpy(reward),
        "mc": torch.from_numpy(mc), "alive": torch.from_numpy(alive),
        "prefix_len": torch.from_numpy(prefix.astype(np.float32)),
        "remaining": torch.from_numpy(np.maximum(length - checkpoint, 0).astype(np.float32)),
        "length": torch.from_numpy(length.astype(np.float32)),
    }


def position_batch(ds, feats: PathFeatures, positions=None) -> dict:
    """One row per (path, position) that the features hold (a path is alive at every
    stored position), optionally only the `positions` listed (generated tokens; None:
    every stored position), in path order then position order. Keys as `tensors_at`, with
    "prefix_len" / "remaining" per row, plus "position" (B,) int64 and "path" (B,) int64,
    the row of `ds`."""
    _check_join(ds, feats)
    sel = np.arange(len(feats.positions)) if positions is None else \
        np.nonzero(np.isin(feats.positions, np.asarray(list(positions), dtype=np.int64)))[0]
    rows, pos = feats.rows[sel], feats.positions[sel]
    length = np.asarray(ds["length"][:]).astype(np.int64)
    correct = np.asarray(ds["correct"][:]).astype(np.float32)
    reward = bank.rewards_of(ds)
    hidden = np.ascontiguousarray(feats.hidden[sel], dtype=np.float32)
    signals = _signals(ds, rows, pos, hidden, feats.attn[sel], feats)
    mc = _mc(ds, feats, rows, pos, reward, np.ones(len(sel), bool))
    return {
        "hidden": torch.from_numpy(hidden), "signals": signals,
        "group": torch.from_numpy(_groups(ds)[rows]),
        "correct": torch.from_numpy(correct[rows]), "reward": torch.from_numpy(reward[rows]),
        "mc": torch.from_numpy(mc),
        "alive": torch.ones(len(sel), dtype=torch.bool),
        "prefix_len": torch.from_numpy(pos.astype(np.float32)),
        "remaining": torch.from_numpy((length[rows] - pos).astype(np.float32)),
        "length": torch.from_numpy(length[rows].astype(np.float32)),
        "position": torch.from_numpy(pos.astype(np.int64)),
        "path": torch.from_numpy(rows.astype(np.int64)),
    }


def _signals(ds, rows, prefix: np.ndarray, hidden: np.ndarray, attn: np.ndarray,
             feats: PathFeatures, chunk: int = 16384) -> torch.Tensor:
    """signal_matrix of the prefixes: confidence columns from the bank's per-token arrays
    (prefix = position), hidden statistics and attention entropy from the features."""
    from stopexp.signals.columns import signal_matrix

    if not len(prefix):
        return torch.zeros((0, len(SIGNAL_NAMES)))
    arrays = _token_arrays(ds)
    rows = np.arange(len(prefix)) if rows is None else rows
    tapped = bool(feats.meta.get("attention_heads"))
    parts = []
    for lo in range(0, len(prefix), chunk):  # (rows, T) token arrays a chunk at a time
        at = slice(lo, lo + chunk)
        lp, ent, conf = (a[torch.from_numpy(rows[at])] for a in arrays)
        parts.append(signal_matrix(lp, ent, conf, torch.from_numpy(prefix[at].astype(np.int64)),
                                   feats.meta["group_window"], torch.from_numpy(hidden[at]),
                                   torch.from_numpy(attn[at]) if tapped else None))
    return torch.cat(parts)


def load_split(cfg, split: str, overrides: list[str] | None = None, make: bool = True):
    """A bank split and its features, joined row for row: (ds, feats). The features are
    made when missing (`require_features`)."""
    out = require_features(cfg, overrides, make)
    return bank.load_bank(bank.bank_dir(cfg), split), load_features(out, split, repair_text(overrides))

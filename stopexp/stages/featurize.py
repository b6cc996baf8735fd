"""Stage 1b, featurize: extract the tapped hidden states of the trace bank's paths.

    python -m stopexp.featurize +exp=toy_contrastive

A teacher-forced forward over each stored path (prompt + generated tokens) yields the
features at every position of `tap.positions` at once (`stopexp.store.feature_sets`). Changing
tap.layers, tap.pooling, tap.attention_heads or tap.positions makes new features from the
same bank; nothing is regenerated. Train, evaluate and adapt require the features this
makes (or collect's in-engine taps); rerunning it repairs damaged shards. Concurrent
featurizers of the same features take turns under their lock
(`stopexp.runtime.artifacts.artifact_lock`): the first computes, the others keep its shards.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
from datasets import load_from_disk

from stopexp.core.protocol import attention_heads, resolve_layers
from stopexp.models.extract import DEFAULT_BATCH_TOKENS, StepEnds, extract, path_positions
from stopexp.runtime.artifacts import artifact_lock
from stopexp.runtime.integrity import set_aside
from stopexp.search.sample import prompt_ids
from stopexp.search.taps import Taps
from stopexp.stages import build
from stopexp.stages.cli import Stage, stage_main
from stopexp.store import bank
from stopexp.store.bank_growth import donor_features, grown_features
from stopexp.signals.feature_spec import SIGNAL_NAMES
from stopexp.store.feature_sets import (FEATURES_VERSION, KIND, TAP_INFO, FeatureSet, feature_columns,
                                    expected_meta, old_meta, repair_text, shape_problem,
                                    summarize_features)

log = logging.getLogger(__name__)


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
    old = old_meta(out)
    problem = bank.misfit(old, want) if old is not None else None
    # shards whose records name no features are trusted by a meta.json that fits
    legacy = out.name if old is not None and problem is None else None
    good, todo = {}, []
    for name in sorted(bmeta["shards"]):
        rec = bank.read_record(out / name) if (out / name).is_dir() else None
        fresh = rec is not None and rec.get("bank_files") == bmeta["shards"][name]["files"] \
            and rec.get("features", legacy) == out.name
        if fresh and bank.shard_problem(out / name, full=True) is None \
                and _fits(out / name, (len(want["tap_layers"]), want["hidden_size"])):
            good[name] = rec
            continue
        if (out / name).exists():
            log.warning("features %s: shard %s is damaged, was made from another bank shard or for "
                        "other features; set aside, it is recomputed", out, name)
            set_aside(out / name)
        grown = bmeta["shards"][name].get("grown_from")  # linked from another bank: its features too
        rec = grown_features(feats, name, bmeta["shards"][name],
                             donor_features(feats, grown["bank"])) if grown else None
        if rec is not None:
            good[name] = rec
            continue
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


def _fits(shard: Path, shape: tuple[int, int]) -> bool:
    """Whether a shard's hidden states are `shape` (layers, width) per position (an empty
    shard holds none)."""
    if not (shard / "dataset_info.json").exists():
        return True
    return shape_problem(load_from_disk(str(shard)).features["hidden"], shape) is None


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
        schema = feature_columns(len(taps.layers), hidden, tap.positions.dtype)
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


@stage_main("featurize", tracked=False)
def main(stage: Stage) -> dict:
    result = featurize(build.feature_set(stage.cfg), stage.overrides)
    log.info("features %s: %d paths, %d positions, %.1f MB, tap layers %s, in %.1f s",
             result["features"], result["paths"], result["positions"], result["bytes"] / 1e6,
             result["tap_layers"], result["wall_s"])
    return {"featurize": result}

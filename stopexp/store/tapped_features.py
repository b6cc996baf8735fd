"""Features written by collect from the states its engine tapped while generating
(stopexp.search.vllm_taps), shard by shard beside the bank's, with the records featurize
checks: featurize then finds them complete and loads no LM."""
from __future__ import annotations

import logging

import numpy as np

from stopexp.models.extract import StepEnds, path_positions
from stopexp.store import bank
from stopexp.store.feature_sets import FeatureSet, feature_columns

log = logging.getLogger(__name__)


def write_tapped(feats: FeatureSet, name: str, rows: dict, states: list[dict], bank_record: dict,
                 step_end: StepEnds, layers: list[int], hidden: int, seconds: float) -> dict:
    """Write the features shard of bank shard `name` from states tapped while its paths
    were generated (`states[r]`: {position: (layers, H)} of bank row r, `rows` its columns)
    at exactly the positions featurize keeps (`path_positions`), so that featurize finds
    it complete; `bank_record` is the bank shard's record, `layers` and `hidden` the tap's."""
    spec = feats.positions
    cols = {k: list(rows[k]) for k in ("split", "prompt_id", "path_id", "length")}
    cols["positions"], cols["hidden"] = [], []
    for r, got in enumerate(states):
        pos = path_positions(rows["tokens"][r], spec, step_end)
        missed = [c for c in pos if c not in got]
        if missed:
            raise RuntimeError(f"in-engine taps missed positions {missed[:5]} of bank shard {name} "
                               f"row {r} (prompt {rows['prompt_id'][r]}, path {rows['path_id'][r]})")
        cols["positions"].append(pos)
        cols["hidden"].append(np.stack([got[c] for c in pos]).astype(np.float32) if pos
                              else np.zeros((0, len(layers), hidden), np.float32))
    cols["attn"] = [np.zeros(0, np.float32)] * len(states)
    return bank.write_shard(feats.root, name, cols, feature_columns(len(layers), hidden, feats.tap.positions.dtype), {
        "features": feats.root.name, "tap_layers": list(layers), "hidden_size": hidden,
        "attention_heads": [], "tapped": "in the engine, while generating",
        "bank_files": bank_record["files"], "seconds": seconds,
        "positions": int(sum(map(len, cols["positions"]))),
        "nonfinite": int(sum((~np.isfinite(h)).sum() for h in cols["hidden"]))})


def all_tapped(feats: FeatureSet) -> bool:
    """After a collect that tapped its paths' states: whether every bank shard has its
    features shard (then featurize only writes the features' meta.json and loads no LM);
    else (shards kept from an earlier collect) featurize computes the rest."""
    bmeta = bank.read_meta(feats.bank.root)
    have = [n for n in bmeta["shards"] if (feats.root / n).is_dir()
            and (rec := bank.read_record(feats.root / n)) is not None
            and rec.get("bank_files") == bmeta["shards"][n]["files"] and rec.get("features") == feats.key]
    if len(have) < len(bmeta["shards"]):
        log.info("features %s: %d of %d bank shards were tapped while generated; featurize "
                 "extracts the rest", feats.root, len(have), len(bmeta["shards"]))
        return False
    return True

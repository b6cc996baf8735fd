"""A features shard whose arrays do not have the artifact's shape (another width, another
number of layers), its record and digests made consistent with it, is refused by every
consumer (train, evaluate, adapt: they read the shards through one function,
stopexp.store.feature_rows) in one line naming the shard and the repair, and featurize
recomputes it."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from datasets import Dataset, load_from_disk

from conftest import compose, featurized
from stopexp.stages.featurize import featurize
from stopexp.config import validate
from stopexp.runtime.integrity import records
from stopexp.stages import build
from stopexp.store import bank, feature_rows, feature_sets


def private(small_bank, tmp_path, *extra):
    overrides = [*small_bank, f"paths.output_dir={tmp_path / 'out'}", *extra]
    shutil.copytree(build.bank(validate(compose("collect", small_bank))).root,
                    build.bank(validate(compose("collect", overrides))).root)
    return overrides


def reshape_shard(out, name: str, layers: int, width: int) -> None:
    """Shard `name` of the features at `out` rewritten with hidden states of `layers` x
    `width`, its record and meta.json's digests updated to match (consistent, but wrong)."""
    meta = bank.read_meta(out)
    record = json.loads((out / name / bank.MANIFEST).read_text())
    rows = load_from_disk(str(out / name)).to_dict()
    rows["hidden"] = [np.resize(np.asarray(h, np.float32), (len(h), layers, width)).tolist()
                      for h in rows["hidden"]]
    shutil.rmtree(out / name)
    columns = feature_sets.feature_columns(layers, width, "float32")
    Dataset.from_dict(rows, features=columns).save_to_disk(str(out / name))
    record["files"] = records(out / name)
    (out / name / bank.MANIFEST).write_text(json.dumps(record))
    meta["shards"][name] = record
    (out / "meta.json").write_text(json.dumps(meta))


ONLY_CONTROLS = ["evaluate.methods=[confidence]", "evaluate.text_metrics=false", "evaluate.bootstrap=20"]


@pytest.mark.parametrize("layers, width", [(1, 32), (1, 192), (2, 96)])
def test_a_shard_of_another_shape_is_refused_by_every_consumer(small_bank, tmp_path, layers, width):
    from stopexp.stages.evaluate import evaluate
    from stopexp.stages.train import train_with_controls

    cfg = featurized(validate(compose("evaluate", private(small_bank, tmp_path, *ONLY_CONTROLS))))
    out = feature_sets.require_features(build.feature_set(cfg))
    names = sorted(bank.read_meta(out)["shards"])
    for name in names:  # the splits each consumer reads lie in different shards
        reshape_shard(out, name, layers, width)
    want = (rf"^features {out}: shard shard-\d+-r000 holds hidden states of {layers} x {width} per "
            r"position, the artifact 1 x 96; repair: python -m stopexp.featurize ")
    for consumer in (lambda: train_with_controls(cfg, progress=False), lambda: evaluate(cfg)):
        with pytest.raises(bank.BankDamaged, match=want):
            consumer()
    featurize(build.feature_set(cfg))  # the repair it names
    assert feature_rows.load_features(out, "test").hidden.shape[1:] == (1, 96)
    assert "confidence" in evaluate(cfg)["methods"]

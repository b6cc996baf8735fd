"""train.max_prompts: the predictor trains on the first N prompts of the bank's train split
(the smallest prompt ids, nested), at one checkpoint or at every position; N keys the
predictor, not the bank or the features, is refused when the bank holds fewer prompts, and
train's metrics record it."""
import json

import numpy as np
import pytest
import torch

from conftest import compose
from stopexp.config import ConfigError, validate
from stopexp.core.protocol import checkpoint_tokens
from stopexp.stages import build
from stopexp.stages.train import train
from stopexp.store import bank
from stopexp.training.data import first_prompts

EPOCHS = "train.epochs=${stopexp_where_read:train.epochs,3}"


def test_the_first_prompts_are_those_of_the_smallest_ids():
    ids = np.array([3, 0, 0, 5, 3, 9, 5])
    assert first_prompts(ids, 2).tolist() == [True, True, True, False, True, False, False]
    assert first_prompts(ids, 1).tolist() == [False, True, True, False, False, False, False]
    assert first_prompts(ids, None).all() and first_prompts(ids, 4).all()
    # nested: a smaller limit's rows are among a larger one's
    assert not (first_prompts(ids, 1) & ~first_prompts(ids, 3)).any()
    with pytest.raises(ConfigError, match=r"^train.max_prompts: 5 exceeds the 4 train prompts the "
                                          r"trace bank holds; lower it to at most 4"):
        first_prompts(ids, 5)


@pytest.mark.parametrize("value, message", [
    ("0", "train.max_prompts: must be >= 1, got 0"),
    ("-3", "train.max_prompts: must be >= 1, got -3"),
    ("13", "train.max_prompts: 13 exceeds the 12 train prompts the trace bank is collected with "
           r"\(collect.prompts.train\); give at most 12"),
])
def test_a_bad_limit_fails_before_compute(small_bank, value, message):
    with pytest.raises(ConfigError, match=f"^{message}$"):
        validate(compose("train", [*small_bank, f"train.max_prompts={value}"]))


def test_the_limit_keys_the_predictor_not_the_bank_or_features(small_bank):
    cfgs = [validate(compose("train", [*small_bank, *extra]))
            for extra in ([], ["train.max_prompts=12"], ["train.max_prompts=5"])]
    feats = [build.feature_set(c) for c in cfgs]
    assert len({f.key for f in feats}) == 1 and len({f.bank.key for f in feats}) == 1
    assert len({build.predictor_dir(c, f).name for c, f in zip(cfgs, feats)}) == 3


def train_prompt_ids(small_bank):
    """(config, the bank's train split, its rows' prompt ids, train.checkpoint in tokens)."""
    cfg = validate(compose("train", small_bank))
    ds = bank.load_bank(build.bank(cfg).root, "train")
    return cfg, ds, np.asarray(ds["prompt_id"][:]), checkpoint_tokens(cfg.train.checkpoint,
                                                                       cfg.search.max_new_tokens)


@pytest.mark.parametrize("positions", ["checkpoint", "all"])
def test_the_training_rows_are_those_of_the_first_prompts(small_bank, positions):
    cfg, ds, ids, ckpt = train_prompt_ids(small_bank)
    assert len(np.unique(ids)) == 12
    over = [*small_bank, f"train.positions={positions}"]
    full = build.training_data(validate(compose("train", over)), build.feature_set(cfg),
                               bank.read_meta(build.bank(cfg).root))
    data = {n: build.training_data(validate(compose("train", [*over, f"train.max_prompts={n}"])),
                                   build.feature_set(cfg), bank.read_meta(build.bank(cfg).root))
            for n in (3, 5)}
    if positions == "all":
        path = full["train"]["path"].numpy()
    else:  # the rows alive at the checkpoint, in bank order
        path = np.nonzero(np.asarray(ds["length"][:]) > ckpt)[0]
    for n, d in data.items():
        keep = torch.from_numpy(first_prompts(ids, n)[path])
        assert 0 < int(keep.sum()) < len(path)
        # (under positions=all "group" numbers the (prompt, position) pairs held, anew)
        for key in ("hidden", "correct", "prompt_group" if positions == "all" else "group"):
            assert torch.equal(d["train"][key], full["train"][key][keep]), key
        for split in ("val", "test"):  # untouched
            assert torch.equal(d[split]["hidden"], full[split]["hidden"])
    prompts = {n: set(ids[path][first_prompts(ids, n)[path]]) for n in data}
    assert prompts[3] == {0, 1, 2} and prompts[5] == {0, 1, 2, 3, 4}


def test_train_records_the_prompts_it_trained_on(small_bank):
    cfg, ds, ids, ckpt = train_prompt_ids(small_bank)
    limited = validate(compose("train", [*small_bank, EPOCHS, "train.max_prompts=5"]))
    m = train(limited, progress=False)
    alive_in_first = int(((np.asarray(ds["length"][:]) > ckpt) & first_prompts(ids, 5)).sum())
    assert m["train_prompts"] == 5 and m["train"]["paths"] == alive_in_first == 40  # 5 prompts x 8 paths, all alive at 5 tokens
    saved = json.loads((build.predictor_dir(limited, build.feature_set(limited)) / "predictor.json").read_text())
    assert saved["metrics"]["train_prompts"] == 5
    assert train(limited, progress=False)["train_prompts"] == 5  # found, not retrained
    every = train(validate(compose("train", [*small_bank, EPOCHS, "train.positions=all",
                                             "train.max_prompts=4"])), progress=False)
    assert every["train_prompts"] == 4
    assert train(validate(compose("train", [*small_bank, EPOCHS])), progress=False)["train_prompts"] == 12


def test_a_limit_above_the_prompts_the_bank_holds_is_refused_when_read(small_bank):
    """A bank may hold fewer prompts than collect.prompts.train asked for (left out as too
    long, or by the difficulty filter): the count is the bank's."""
    cfg = validate(compose("train", [*small_bank, "train.max_prompts=12"]))
    cfg.train.max_prompts = 13  # past validate, as if the bank held fewer than collected
    with pytest.raises(ConfigError, match=r"^train.max_prompts: 13 exceeds the 12 train prompts the "
                                          r"trace bank holds; lower it to at most 12 or collect more"):
        build.training_data(cfg, build.feature_set(cfg), bank.read_meta(build.bank(cfg).root))

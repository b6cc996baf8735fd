"""The non-learnable signal columns: hidden-state norm, mean and variance of the deepest
tapped layer, by hand and as stored in a trace bank."""
import numpy as np
import pytest
import torch

from stopexp.signals.columns import hidden_statistics, signal_matrix
from stopexp.signals.feature_spec import SIGNAL_NAMES
from stopexp.signals.methods import BASELINES
from stopexp.stages import build


def test_hidden_statistics_read_the_deepest_tapped_layer():
    hidden = torch.tensor([[[9.0, 9.0, 9.0, 9.0], [1.0, 2.0, 3.0, 4.0]],
                           [[0.0, 0.0, 0.0, 0.0], [-2.0, 2.0, -2.0, 2.0]]])  # (B=2, layers=2, H=4)
    s = hidden_statistics(hidden)
    assert s["hidden_norm"].tolist() == pytest.approx([30 ** 0.5, 4.0])
    assert s["hidden_mean"].tolist() == pytest.approx([2.5, 0.0])
    assert s["hidden_var"].tolist() == pytest.approx([1.25, 4.0])  # divided by H, not H - 1


def test_signal_matrix_columns_and_baselines():
    lp = torch.tensor([[-1.0, -3.0, -0.5]])
    ent, conf = torch.tensor([[0.5, 1.5, 9.0]]), torch.tensor([[2.0, 4.0, 9.0]])
    hidden = torch.tensor([[[1.0, 2.0, 3.0, 4.0]]])
    m = signal_matrix(lp, ent, conf, torch.tensor([2]), 2, hidden)
    assert m.shape == (1, len(SIGNAL_NAMES)) and m.dtype == torch.float32
    got = dict(zip(SIGNAL_NAMES, m[0].tolist()))
    assert got == pytest.approx({"mean_logprob": -2.0, "min_logprob": -3.0, "mean_entropy": 1.0,
                                 "group_conf": 3.0, "hidden_norm": 30 ** 0.5, "hidden_mean": 2.5,
                                 "hidden_var": 1.25, "attn_entropy": 0.0, "prefix_len": 2.0})
    with_attn = signal_matrix(lp, ent, conf, torch.tensor([2]), 2, hidden, torch.tensor([0.75]))
    assert with_attn[0, SIGNAL_NAMES.index("attn_entropy")] == 0.75
    batch = {"signals": with_attn}
    assert BASELINES["attn_entropy"](batch).item() == -0.75  # focused attention ranks first
    assert BASELINES["hidden_mean"](batch).item() == pytest.approx(2.5)
    assert BASELINES["hidden_var"](batch).item() == pytest.approx(1.25)


def test_conf_features_reads_the_signals_it_is_given():
    from stopexp.config import PredictorConfig
    from stopexp.signals import FeatureSpec, build_predictor

    spec = FeatureSpec("m", 4, [0])
    plain = build_predictor(PredictorConfig(name="conf_features"), spec)
    more = build_predictor(PredictorConfig(name="conf_features", signals=["attn_entropy"]), spec)
    names = list(SIGNAL_NAMES)
    assert plain.columns.tolist() == [0, 1, 2, 3, names.index("prefix_len")]
    assert more.columns.tolist() == [*plain.columns.tolist(), names.index("attn_entropy")]
    assert more.norm.num_features == 6


def test_features_give_the_statistics_of_their_hidden_states(small_bank):
    from conftest import compose
    from stopexp.config import validate
    from stopexp.store import bank, feature_rows

    cfg = validate(compose("train", small_bank))
    root = build.bank(cfg).root
    assert bank.read_meta(root)["version"] == bank.BANK_VERSION == 4
    ds, feats = feature_rows.load_split(build.feature_set(cfg), "test")
    batch = feature_rows.tensors_at(ds, feats, 5)
    hidden, signals = batch["hidden"].numpy(), batch["signals"].numpy()   # (P, L, H), (P, S)
    deepest = hidden[:, -1].astype(np.float64)
    for name, want in (("hidden_norm", np.linalg.norm(deepest, axis=-1)),
                       ("hidden_mean", deepest.mean(-1)), ("hidden_var", deepest.var(-1))):
        assert np.allclose(signals[..., SIGNAL_NAMES.index(name)], want, rtol=1e-5, atol=1e-6), name
    first = dict(zip(SIGNAL_NAMES, signals[0]))  # the first test path at the first check
    # pinned: the values taps read during decoding give, to float tolerance
    assert [first[n] for n in ("hidden_norm", "hidden_mean", "hidden_var", "attn_entropy")] == \
        pytest.approx([101.54023, 1.3266039, 105.640305, 0.0], rel=1e-5)
    assert (np.asarray(ds["prompt_len"][:8]) == 15).all()  # prompt tokens, for the KV estimate
    # arith has no intermediate values: its bank has no first_wrong_value column
    assert "first_wrong_value" not in ds.column_names and "first_wrong_value" not in batch
    assert bank.read_meta(root)["kv_bytes_per_token"] == 2 * 3 * 4 * 24 * 4  # the toy LM, float32


def test_a_bank_of_another_layout_version_is_refused_by_name(tmp_path):
    import json

    from stopexp.store import bank

    (tmp_path / "meta.json").write_text(json.dumps({"version": 3, "shards": {}, "complete": True}))
    with pytest.raises(bank.BankDamaged, match=r"bank version 3, 4 expected.*(?s:.*)rerun the collect"):
        bank.verify_bank(tmp_path)

"""predictor.centre_prompts: each path's hidden state minus the mean of its prompt's live
paths at the same position (stopexp/signals/centring.py), by hand on a tiny batch, in the
predictors, in chunked scoring, and end to end: trained on the toy bank and scored by
evaluate's replay exactly as in training."""
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from conftest import compose
from stopexp.config import ConfigError, validate
from stopexp.signals import FeatureSpec, build_predictor
from stopexp.signals.centring import centred, peer_chunks, peer_keys
from stopexp.training.fit import score


def tiny_batch() -> dict:
    """Prompt 0 has three live paths at position 4, a path that ended there (not live) and
    one live path at position 8; prompt 1 one live path at position 4."""
    hidden = torch.tensor([[1., 2.], [3., 6.], [5., 1.], [100., 100.], [2., -2.], [7., 7.]])
    return {"hidden": hidden[:, None, :],  # (B, 1 tapped layer, H=2)
            "group": torch.tensor([0, 0, 0, 0, 1, 0]),
            "prefix_len": torch.tensor([4., 4., 4., 4., 4., 8.]),
            "alive": torch.tensor([True, True, True, False, True, True]),
            "correct": torch.tensor([1., 0., 1., 0., 1., 0.])}


# by hand: prompt 0's live paths at position 4 have the mean ((1+3+5)/3, (2+6+1)/3) = (3, 3);
# the ended path is nobody's peer but is centred on that mean too; a path without a live
# peer (prompt 1's, prompt 0's at position 8) is centred on itself, to zero
CENTRED = [[-2., -1.], [0., 3.], [2., -2.], [97., 97.], [0., 0.], [0., 0.]]


def test_centring_by_hand():
    b = tiny_batch()
    assert peer_keys(b).tolist() == [0, 0, 0, 0, 2, 1]
    assert centred(b["hidden"], b)[:, 0].tolist() == CENTRED
    assert centred(b["hidden"][:, 0], b).tolist() == CENTRED  # (B, H) as the single-tap heads centre it


def test_the_prompt_is_read_from_seed_keys_online_and_owners_in_beams():
    h = torch.tensor([[1., 1.], [3., 5.], [10., 0.], [2., 3.]])
    online = {"seed_key": ["q1/0", "q1/1", "q2/0", "q1/2"], "prefix_len": torch.full((4,), 6.)}
    assert centred(h, online).tolist() == [[-1., -2.], [1., 2.], [0., 0.], [0., 0.]]
    beams = {"owner": torch.tensor([0, 0, 1, 0]), "prefix_len": torch.full((4,), 6.)}
    assert centred(h, beams).tolist() == centred(h, online).tolist()


def head_config(name: str, **extra):
    return OmegaConf.create({"name": name, "layer": -1, "hidden": 4, "depth": 1, "dropout": 0.0,
                             "position_input": False, "centre_prompts": True, **extra})


def test_the_linear_probe_scores_the_layer_normalised_centred_state():
    spec = FeatureSpec("toy", 2, [1])
    probe = build_predictor(head_config("linear"), spec)
    with torch.no_grad():
        probe.head.weight.copy_(torch.tensor([[1.0, 0.0]]))
        probe.head.bias.fill_(0.25)
    want = torch.nn.functional.layer_norm(torch.tensor(CENTRED), (2,)) @ torch.tensor([1.0, 0.0]) + 0.25
    assert probe(tiny_batch()).tolist() == want.tolist()
    # two live paths of a prompt: +-(1, -1) / sqrt(1 + eps) after the norm, so +-1 before the bias
    assert probe(tiny_batch())[[0, 2]].tolist() == pytest.approx([-1 + 0.25, 1 + 0.25], abs=1e-4)


@pytest.mark.parametrize("name", ["linear", "mlp", "fusion"])
def test_what_a_prompts_paths_share_changes_no_score(name):
    """Adding one vector to every path of a prompt (integers: exact in float32) leaves the
    centred scores as they were, and changes the uncentred ones."""
    torch.manual_seed(0)
    spec = FeatureSpec("toy", 8, [0, 1])
    group = torch.arange(6).repeat_interleave(4)
    batch = {"hidden": torch.randint(-5, 6, (24, 2, 8)).float(), "group": group,
             "prefix_len": torch.full((24,), 5.0), "correct": torch.zeros(24)}
    shifted = {**batch, "hidden": batch["hidden"] + torch.randint(-50, 50, (6, 2, 8)).float()[group]}
    centring = build_predictor(head_config(name), spec).eval()
    plain = build_predictor(head_config(name, centre_prompts=False), spec).eval()
    with torch.no_grad():
        for p in centring.parameters():  # the linear probe starts at zero: it would tie every path
            p.normal_()
        plain.load_state_dict(centring.state_dict())
        assert torch.equal(centring(shifted), centring(batch))
        assert not torch.allclose(plain(shifted), plain(batch))


def test_chunks_hold_whole_peer_groups_and_score_as_one_batch():
    torch.manual_seed(1)
    n = 60  # 5 prompts x 3 positions x 4 paths, rows shuffled
    perm = torch.randperm(n)
    batch = {"hidden": torch.randn(n, 1, 8), "group": (torch.arange(n) // 12)[perm],
             "prefix_len": (4.0 * (torch.arange(n) // 4 % 3))[perm], "correct": torch.zeros(n)}
    chunks = peer_chunks(batch, 10)
    assert sorted(torch.cat(chunks).tolist()) == list(range(n))
    keys = peer_keys(batch)
    assert [len(c) for c in chunks] == [12, 12, 12, 12, 12]  # 3 groups of 4 reach 10 rows
    for c in chunks:
        inside = set(keys[c].tolist())
        assert (keys[np.isin(keys.numpy(), list(inside))].numel()) == len(c)
    mlp = build_predictor(head_config("mlp"), FeatureSpec("toy", 8, [0]))
    assert torch.allclose(score(mlp, batch, chunk=10), score(mlp, batch, chunk=10_000), atol=1e-6)


@pytest.mark.parametrize("override, message", [
    ("predictor=conf_features", "predictor.centre_prompts: predictor=conf_features has no learned head"),
    ("predictor=statistic", "predictor.centre_prompts: predictor=statistic has no learned head"),
])
def test_predictors_without_a_head_on_the_hidden_state_refuse_it(override, message):
    with pytest.raises(ConfigError, match=f"^{message}.*allowed with linear, mlp, fusion, hidden_conf$"):
        validate(compose("train", [override, "predictor.centre_prompts=true"]))


def test_adapt_and_steps_signal_refuse_it():
    with pytest.raises(ConfigError, match="^predictor.centre_prompts: adapt updates the predictor"):
        validate(compose("adapt", ["predictor.centre_prompts=true"]))
    step = ["predictor.centre_prompts=true", "evaluate.methods=[learned,step]", "engine.kv_budget=0.5",
            "tap.positions.step_ends=true"]
    with pytest.raises(ConfigError, match="^predictor.centre_prompts: step scores each path at its own"):
        validate(compose("evaluate", step))
    validate(compose("evaluate", [*step, "evaluate.stopping.step.signal=confidence",
                                  "evaluate.methods=[learned,step,confidence]"]))


# ---- end to end on the toy bank -------------------------------------------------------------
EPOCHS = "train.epochs=${stopexp_where_read:train.epochs,3}"
CENTRE = ["predictor.centre_prompts=true", EPOCHS]


@pytest.fixture(scope="module")
def centred_run(small_bank, tmp_path_factory):
    """The mlp trained with centre_prompts on the toy bank, and evaluate's replay of it."""
    from stopexp.stages.evaluate import evaluate
    from stopexp.stages.train import train

    fast = ["evaluate.n_points=[4,8]", "evaluate.retention=[2,4]", "policy.keep=4",
            "evaluate.bootstrap=50", "evaluate.text_metrics=false",
            "evaluate.methods=[learned,confidence]"]
    trained = train(validate(compose("train", [*small_bank, *CENTRE])), progress=False)
    cfg = validate(compose("evaluate", [*small_bank, *CENTRE, *fast]))
    return small_bank, cfg, trained, evaluate(cfg, run_dir=tmp_path_factory.mktemp("eval"))


def check_tokens(cfg) -> int:
    """Where evaluate reads the AUROC (the first check), which is where train trained."""
    from stopexp.core.protocol import check_plan, checkpoint_tokens

    check = check_plan(cfg.search, cfg.policy)[0][0]
    assert check == checkpoint_tokens(cfg.train.checkpoint, cfg.search.max_new_tokens)
    return check


def test_a_centred_predictor_trains_and_evaluates(centred_run):
    from stopexp.stages import build

    small_bank, cfg, trained, metrics = centred_run
    plain = validate(compose("train", [*small_bank, EPOCHS]))
    assert trained["checkpoint"] != str(build.predictor_dir(plain, build.feature_set(plain)))
    # pinned: the within-prompt AUROC on the 48 test paths alive at the check, after 3 epochs
    assert trained["test"]["paths"] == 48
    assert trained["test"]["auroc"] == pytest.approx(0.763095238095238, abs=1e-9)
    mlp = metrics["methods"]["mlp"]
    assert {"accuracy", "tokens_total", "auroc", "auroc_pooled"} <= set(mlp)
    # evaluate scores the bank's test paths at the check in one batch of every path (the
    # ended ones too), train scored the live ones alone: the same centring, the same AUROCs
    check_tokens(cfg)
    assert mlp["auroc"] == pytest.approx(trained["test"]["auroc"], abs=1e-12)
    assert mlp["auroc_pooled"] == pytest.approx(trained["test"]["auroc_pooled"], abs=1e-12)


def test_replay_scores_equal_the_training_scores_of_the_live_paths(centred_run):
    from stopexp.evaluation.accounting import replay_paths
    from stopexp.signals.saved_predictor import load_predictor
    from stopexp.stages import build
    from stopexp.store import bank, feature_sets

    _, cfg, trained, _ = centred_run
    feats = build.feature_set(cfg)
    meta = bank.read_meta(feats.bank.root)
    predictor, _ = load_predictor(trained["checkpoint"], feature_sets.spec_of(cfg.tap.layers, meta),
                                  cfg.predictor)
    paths = replay_paths(feats.bank.root, feats.root, "test", check_tokens(cfg))
    live = torch.from_numpy(paths.alive)
    with torch.no_grad():
        replayed = predictor(paths.batch)[live]
        trained_on = score(predictor, build.training_data(cfg, feats, meta)["test"])
        assert len(replayed) == len(trained_on) == int(live.sum()) > 0
        assert torch.allclose(replayed, trained_on, atol=1e-6)
        # a prompt's shared part is gone: shifting every path of a prompt changes no score
        shift = torch.randn(int(paths.batch["group"].max()) + 1, *paths.batch["hidden"].shape[1:])
        moved = {**paths.batch, "hidden": paths.batch["hidden"] + shift[paths.batch["group"]]}
        assert torch.allclose(predictor(moved)[live], replayed, atol=1e-4)



def test_a_checkpoint_saved_before_the_key_existed_loads_as_uncentred(small_bank, tmp_path):
    import json
    import shutil

    from stopexp.signals.saved_predictor import CheckpointMismatch, load_predictor
    from stopexp.stages import build
    from stopexp.stages.train import train
    from stopexp.store import bank, feature_sets

    cfg = validate(compose("train", [*small_bank, EPOCHS]))
    ckpt = tmp_path / build.predictor_dir(cfg, build.feature_set(cfg)).name  # a private copy
    shutil.copytree(train(cfg, progress=False)["checkpoint"], ckpt)
    spec = feature_sets.spec_of(cfg.tap.layers, bank.read_meta(build.bank(cfg).root))
    meta = json.loads((ckpt / "predictor.json").read_text())
    assert meta["predictor"].pop("centre_prompts") is False
    (ckpt / "predictor.json").write_text(json.dumps(meta))
    predictor, _ = load_predictor(ckpt, spec, cfg.predictor)  # recorded by an older version
    assert predictor.centre_prompts is False
    meta["predictor"]["centre_prompts"] = True
    (ckpt / "predictor.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointMismatch, match="records predictor.centre_prompts=True, this "
                                                 "config has predictor.centre_prompts=False"):
        load_predictor(ckpt, spec, cfg.predictor)

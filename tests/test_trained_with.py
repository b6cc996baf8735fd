"""evaluate.trained_with: predictors trained on one bank score another bank's test split,
with the same scores as the predictor applied directly to those features, and features of
another kind (LM, tap, confidence columns) are refused in one line before anything loads."""
import json
import re
import shlex

import numpy as np
import pytest
import torch

from conftest import compose, featurized, run_stage
from stopexp.config import ConfigError, validate
from stopexp.core.errors import NotFound
from stopexp.core.protocol import checkpoint_tokens
from stopexp.evaluation.accounting import replay_paths
from stopexp.metrics import within_prompt_auroc
from stopexp.signals import methods as M
from stopexp.signals.saved_predictor import load_predictor
from stopexp.stages import build
from stopexp.stages.collect import collect
from stopexp.stages.evaluate import evaluate
from stopexp.stages.scorers import build_scorers
from stopexp.stages.train import train
from stopexp.stages.trained_with import predictors_for
from stopexp.store import bank, feature_sets

TRAINING = ["predictor=linear", "train.epochs=2"]
# another bank: other test prompts (after the first 20 of each split's draw) and another seed
OTHER = ["seed=1", "task.prompt_offset=20", "collect.prompts.train=0", "collect.prompts.val=0",
         "collect.prompts.test=6", "collect.mc_rollouts=0"]
METHODS = "evaluate.methods=[no_prune,random,confidence,oracle,linear]"


@pytest.fixture(scope="module")
def banks(small_bank):
    """(the training overrides, the other bank's evaluate overrides) once its predictor is
    trained on the small bank and the other bank collected and featurized."""
    trainer = [*small_bank, *TRAINING]
    train(validate(compose("train", trainer)), progress=False)
    other = [*small_bank, *OTHER, "evaluate.bootstrap=50", METHODS]
    cfg = validate(compose("collect", other))
    collect(build.collection(cfg))
    featurized(cfg)
    return trainer, [*other, f"evaluate.trained_with={json.dumps(shlex.join(trainer))}"]


def test_another_banks_predictor_scores_this_bank_as_applied_directly(banks):
    trainer, other = banks
    cfg = validate(compose("evaluate", other))
    feats = build.feature_set(cfg)
    evaluating, home = predictors_for(cfg, feats)
    assert home.features.bank.key != feats.bank.key  # another bank, not this one's
    tcfg = validate(compose("train", trainer))
    ckpt = build.predictor_dir(tcfg, build.feature_set(tcfg))
    assert ckpt == build.predictor_dir(home.cfg, home.features)
    meta = bank.read_meta(feats.bank.root)
    spec = feature_sets.spec_of(cfg.tap.layers, meta)
    direct, _ = load_predictor(ckpt, spec, tcfg.predictor)
    check = checkpoint_tokens(cfg.search.check_at, cfg.search.max_new_tokens)
    paths = replay_paths(feats.bank.root, feature_sets.require_features(feats), "test", check)
    scored = build_scorers(evaluating, ["linear"], spec, feats, home=home)["linear"](paths.batch)
    expected = M.learned(direct)(paths.batch)
    assert torch.equal(scored, expected)
    metrics = evaluate(cfg)
    alive = paths.batch["alive"].numpy()
    auroc = within_prompt_auroc(expected.numpy().astype(float)[alive], paths.correct[alive], paths.group[alive])
    assert metrics["methods"]["linear"]["auroc"] == auroc
    assert metrics["trained_with"] == {"overrides": trainer, "bank": home.features.bank.key,
                                       "features": home.features.key}
    assert metrics["bank"] == feats.bank.key


def test_the_training_configs_sections_replace_this_ones(banks):
    _, other = banks
    cfg = validate(compose("evaluate", [*other, "train.epochs=7", "predictor=mlp"]))
    evaluating, home = predictors_for(cfg, build.feature_set(cfg))
    assert (evaluating.predictor.name, evaluating.train.epochs) == ("linear", 2)
    assert evaluating.loss == home.cfg.loss and evaluating.search == cfg.search


@pytest.mark.parametrize("override, message", [
    ("tap.pooling=mean", "tap.pooling=last, this config's are tap.pooling=mean"),
    ("tap=multi", "tap.layers (resolved)=[2], this config's are tap.layers (resolved)=[0, 1, 2]"),
    ("search.group_window=4", "search.group_window=8, this config's are search.group_window=4"),
    ("search.conf_topk=3", "search.conf_topk=5, this config's are search.conf_topk=3"),
    ("model.dtype=float16", "model.dtype=float32, this config's are model.dtype=float16"),
    ("model.toy.seed=1", "model.toy.seed=0, this config's are model.toy.seed=1"),
])
def test_features_of_another_kind_are_refused(banks, override, message):
    _, other = banks
    cfg = validate(compose("evaluate", [*other, override]))
    with pytest.raises(ConfigError) as e:
        predictors_for(cfg, build.feature_set(cfg))
    text = str(e.value)
    assert text.startswith(f"evaluate.trained_with: its predictors read features with {message}; ")
    assert "\n" not in text


def test_the_stage_refuses_in_one_line_before_compute(banks, tmp_path, capsys):
    _, other = banks
    with pytest.raises(SystemExit) as e:
        run_stage("evaluate", [*other, "tap.pooling=mean", f"hydra.run.dir={tmp_path}"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: evaluate.trained_with: its predictors read features with "
                              "tap.pooling=last, this config's are tap.pooling=mean; ")
    assert not (tmp_path / "metrics.json").exists()


def test_a_predictor_not_trained_there_names_the_command_that_trains_it(banks):
    trainer, other = banks
    # hidden_conf is not among the training config's evaluate.methods: its train did not make it
    cfg = validate(compose("evaluate", [*other, "evaluate.methods=[confidence,hidden_conf]"]))
    evaluating, home = predictors_for(cfg, build.feature_set(cfg))
    spec = feature_sets.spec_of(cfg.tap.layers, bank.read_meta(build.feature_set(cfg).bank.root))
    with pytest.raises(NotFound, match=r"make it with: python -m stopexp\.train " + " ".join(
            map(re.escape, trainer)) + r" 'evaluate\.methods=\[learned,hidden_conf\]' "):
        build_scorers(evaluating, ["hidden_conf"], spec, build.feature_set(cfg), home=home)


@pytest.mark.parametrize("value, message", [
    ("'", "evaluate.trained_with: \"'\" cannot be split into overrides (No closing quotation)"),
    ("  ", "evaluate.trained_with: empty; give the train command's overrides"),
])
def test_a_value_that_is_no_command_line_is_refused(value, message):
    with pytest.raises(ConfigError) as e:
        validate(compose("evaluate", ["logger=none", f"evaluate.trained_with={json.dumps(value)}"]))
    assert str(e.value).startswith(message)


def test_the_pipeline_refuses_it():
    with pytest.raises(ConfigError, match=r"^evaluate\.trained_with: the pipeline trains and scores "
                                          r"this config's own predictors"):
        validate(compose("pipeline", ["logger=none", 'evaluate.trained_with="seed=1"']))


def test_a_bad_training_override_is_named_under_the_key(banks):
    _, other = banks
    cfg = validate(compose("evaluate", [*other[:-1], 'evaluate.trained_with="train.epochz=3"']))
    with pytest.raises(ConfigError, match=r"^evaluate\.trained_with: .*train\.epochz"):
        predictors_for(cfg, build.feature_set(cfg))

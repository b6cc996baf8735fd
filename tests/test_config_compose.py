"""Every experiment and every group option composes and validates, Hydra's dirs lie under
the outputs, and a misspelt key (on the command line, in a group's yaml or in an
experiment), a value of the wrong type or a force-added key fails naming the key."""
import shutil

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import OmegaConfBaseException

from conftest import CONF, compose
from stopexp.config import ConfigError, validate


EXPERIMENTS = sorted(p.relative_to(CONF / "exp").with_suffix("").as_posix()
                     for p in (CONF / "exp").rglob("*.yaml"))


STAGES = ["collect", "train", "evaluate", "pipeline", "toy_lm"]


@pytest.mark.parametrize("exp", EXPERIMENTS)
def test_every_experiment_composes_and_validates(exp):
    for stage in STAGES:
        cfg = compose(stage, [f"+exp={exp}"])
        if stage in ("train", "pipeline") and cfg.collect.prompts.train == 0:
            # a split to score other banks' predictors on (evaluate.trained_with): nothing to fit
            with pytest.raises(ConfigError, match=r"^collect\.prompts\.train: train needs train "
                                                  r"prompts in the trace bank, got 0$"):
                validate(cfg)
            continue
        assert validate(cfg).stage == stage


def test_experiments_exist():
    assert {"toy_contrastive", "llama_contrastive", "toy_reward"} <= set(EXPERIMENTS)


def test_llama_experiment_values():
    cfg = compose("train", ["+exp=llama_contrastive"])
    assert cfg.model.path == "meta-llama/Llama-3.1-8B-Instruct"
    assert cfg.model.dtype == "auto" and cfg.loss.name == "contrastive"
    # name and sizes come from the path and the loaded model, not from an 8B default
    assert cfg.model.name == "Llama-3.1-8B-Instruct"
    assert cfg.model.num_layers is None and cfg.model.hidden_size is None
    assert list(cfg.tap.layers) == ["mid"]
    other = compose("train", ["+exp=llama_contrastive", "model.path=/models/my-3b-llama/"])
    assert other.model.name == "my-3b-llama"
    named = compose("train", ["+exp=llama_contrastive", "model.name=mine"])
    assert named.model.name == "mine"


def test_every_group_option_composes():
    for group_dir in CONF.iterdir():
        if not group_dir.is_dir() or group_dir.name in ("exp", "hparams_search", "hydra"):
            continue
        for option in group_dir.glob("*.yaml"):
            # beam search prunes nothing with the default top-K policy (tests/test_config_values.py)
            extra = ["policy=quantile"] if (group_dir.name, option.stem) == ("search", "beam") else []
            if (group_dir.name, option.stem) == ("reward", "external"):  # it names its function
                extra = ["reward.function=stopexp.tasks.datatotext:mentions"]
            if (group_dir.name, option.stem) == ("task", "datatotext"):  # the toy LM's 256 positions
                extra = ["task.shots=0"]
            if (group_dir.name, option.stem) == ("reward", "evaluate"):  # it names its module
                extra = [f"reward.module={CONF.parent / 'tests/data/evaluate/word_recall'}"]
            validate(compose("pipeline", [f"{group_dir.name}={option.stem}", *extra]))


def test_hydra_dirs_under_outputs():
    cfg = compose("collect", return_hydra_config=True)
    out = cfg.paths.output_dir
    assert cfg.hydra.run.dir.startswith(out + "/runs/collect/")
    assert cfg.hydra.sweep.dir.startswith(out + "/multirun/")


@pytest.mark.parametrize("override, key", [
    ("model.hiden_size=3", "hiden_size"),        # a misspelt key
    ("search.temprature=0.5", "temprature"),
    ("search.n_paths=many", "n_paths"),          # a value of the wrong type
    ("search.temperature=hot", "temperature"),
])
def test_a_misspelt_key_or_a_wrong_type_names_the_key(override, key):
    with pytest.raises((ConfigCompositionException, OmegaConfBaseException)) as e:
        compose("collect", [override])
    assert key in str(e.value) or key in str(e.value.__cause__)


def test_force_added_key_is_refused_by_validate():
    cfg = compose("collect", ["+tap.pooling_mode=mean"])
    with pytest.raises(ConfigError, match="^tap.pooling_mode: no such key"):
        validate(cfg)


def test_misspelt_key_in_yaml_names_the_key(tmp_path):
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    (conf / "model" / "typo.yaml").write_text(
        (CONF / "model" / "toy.yaml").read_text().replace("dtype:", "dtpye:"))
    with pytest.raises((ConfigCompositionException, OmegaConfBaseException)) as e:
        compose("collect", ["model=typo"], conf_dir=conf)
    assert "dtpye" in str(e.value) or "dtpye" in str(e.value.__cause__)


def test_misspelt_key_in_experiment_names_the_key(tmp_path):
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    (conf / "exp" / "typo.yaml").write_text("# @package _global_\nsearch:\n  n_path: 3\n")
    with pytest.raises((ConfigCompositionException, OmegaConfBaseException)) as e:
        compose("collect", ["+exp=typo"], conf_dir=conf)
    assert "n_path" in str(e.value) or "n_path" in str(e.value.__cause__)

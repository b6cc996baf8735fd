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
        cfg = validate(compose(stage, [f"+exp={exp}"]))
        assert cfg.stage == stage


def test_experiments_exist():
    assert {"toy_contrastive", "llama_contrastive", "toy_reward"} <= set(EXPERIMENTS)


def test_llama_experiment_values():
    cfg = compose("train", ["+exp=llama_contrastive"])
    assert cfg.model.path == "meta-llama/Llama-3.1-8B-Instruct"
    assert cfg.model.dtype == "bfloat16" and cfg.loss.name == "contrastive"


def test_every_group_option_composes():
    for group_dir in CONF.iterdir():
        if not group_dir.is_dir() or group_dir.name in ("exp", "hparams_search", "hydra"):
            continue
        for option in group_dir.glob("*.yaml"):
            validate(compose("pipeline", [f"{group_dir.name}={option.stem}"]))


def test_hydra_dirs_under_outputs():
    cfg = compose("collect", return_hydra_config=True)
    out = cfg.paths.output_dir
    assert cfg.hydra.run.dir.startswith(out + "/runs/collect/")
    assert cfg.hydra.sweep.dir.startswith(out + "/multirun/")


@pytest.mark.parametrize("override, key", [
    ("model.hiden_size=3", "hiden_size"),
    ("search.temprature=0.5", "temprature"),
])
def test_misspelt_key_on_command_line_names_the_key(override, key):
    with pytest.raises((ConfigCompositionException, OmegaConfBaseException)) as e:
        compose("collect", [override])
    assert key in str(e.value) or key in str(e.value.__cause__)


@pytest.mark.parametrize("override, key", [
    ("search.n_paths=many", "n_paths"),
    ("search.temperature=hot", "temperature"),
    ("tap.layers=[a]", "layers"),
])
def test_wrong_type_names_the_key(override, key):
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


@pytest.mark.parametrize("override, key", [
    ("tap.layers=[4]", "tap.layers"),
    ("tap.layers=[-5]", "tap.layers"),
    ("search.temperature=0", "search.temperature"),
    ("search.temperature=-1", "search.temperature"),
    ("policy.keep=65", "policy.keep"),
    ("search.n_paths=0", "search.n_paths"),
    ("tap.checkpoints=[64]", "tap.checkpoints"),
    ("tap.checkpoints=[2.5]", "tap.checkpoints"),
    ("search.check_at=0.5", "search.check_at"),
    ("collect.mc_rollouts=-1", "collect.mc_rollouts"),
    ("task.multipliers=[2]", "task.multipliers"),
    ("task.styles.careful=-1", "task.styles"),
    ("predictor=mlp", None),
    ("predictor.name=transformer", "predictor.name"),
    ("search.top_p=0", "search.top_p"),
    ("search.beam_checks=[70]", "search.beam_checks"),
    ("collect.keep_correct=[30,4]", "collect.keep_correct"),
    ("evaluate.retention=[100]", "evaluate.retention"),
    ("model.toy.num_heads=5", "model.toy.num_heads"),
])
def test_range_errors_name_the_key(override, key):
    cfg = compose("pipeline", [override])
    if key is None:
        validate(cfg)
        return
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    assert str(e.value).startswith(key + ":")

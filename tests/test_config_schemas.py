"""One schema per option: each option's yaml extends its own schema, a section holds its
group's view (so that what artifact keys hash is unchanged), the cross-group rules are
listed with their stages, and names are checked without importing torch."""
import json
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from conftest import CONF, ROOT, compose, run_stage
from stopexp.config import ConfigError, validate
from stopexp.config.root import GROUPS
from stopexp.config.validation import RULES, STAGES
from stopexp.core.names import names, predictor_names
from stopexp.runtime.artifacts import config_hash, plain

# config_hash(plain(cfg.<section>)) of these compositions, pinned: the keys and values every
# artifact key hashes, whichever schemas hold them. A deliberate change of a section
# re-pins them with scripts/pin_config_sections.py, which lists what moved.
PINNED = json.loads((ROOT / "tests" / "data" / "config_sections.json").read_text())


def _case(name: str):
    stage, *overrides = name.split(" ")
    return stage, overrides


@pytest.mark.parametrize("name", sorted(PINNED))
def test_every_section_hashes_as_pinned(name):
    cfg = compose(*_case(name))
    got = {s: config_hash(plain(cfg[s])) for s in PINNED[name]}
    moved = {s: f"{PINNED[name][s]} -> {h}" for s, h in got.items() if h != PINNED[name][s]}
    assert not moved, (f"{name}: sections moved {moved}; if deliberate, re-pin with "
                       "python scripts/pin_config_sections.py")


# The predictor's artifact key (build.predictor_dir) of these compositions, as it was before
# train.max_prompts, train.early_stopping, train.accumulate, train.mixed_only,
# predictor.centre_prompts, predictor.pca_components and predictor.lora_dropout existed: keys added later are left out at
# their defaults (stopexp.core.added_keys), so every predictor trained before keeps its key
# although the sections above hash otherwise.
PREDICTOR_KEYS = {
    "": "2f87fabb6aa0", "predictor=linear": "709aa7a91b26", "predictor=statistic": "ab88e2c56f68",
    "predictor=conf_features": "b71066356059", "predictor=fusion tap=multi": "4669148eec0d",
    "policy=risk": "63ba639f814b",
    "train.positions=all predictor.position_input=true tap.positions.stride=2": "3d8bfd8b87d6",
}


@pytest.mark.parametrize("overrides", sorted(PREDICTOR_KEYS))
def test_a_predictors_key_leaves_the_added_keys_out_at_their_defaults(overrides):
    from stopexp.stages import build

    cfg = validate(compose("pipeline", overrides.split()))
    features = build.feature_set(cfg)
    assert build.predictor_dir(cfg, features).name == PREDICTOR_KEYS[overrides]
    if cfg.train.positions == "all":  # its single-checkpoint control too
        control = build.controls(cfg)["mlp@5"]
        assert build.predictor_dir(control, features).name == "fc0b4d4fb837"
    others = [validate(compose("pipeline", [*overrides.split(), extra])) for extra in
            (*(["train.max_prompts=150", "train.early_stopping=false", "train.accumulate=2",
                "train.mixed_only=true"]
               if cfg.predictor.name != "statistic" else []),  # a statistic reads neither
             *(["predictor.centre_prompts=true"] if cfg.predictor.name in ("linear", "mlp", "fusion") else []),
             *(["predictor.pca_components=8"] if cfg.predictor.name in ("linear", "mlp") else []))]
    for other in others:  # set, they make other predictors of the same features
        assert build.feature_set(other).key == features.key
        assert build.predictor_dir(other, features).name != PREDICTOR_KEYS[overrides]


def test_the_pinned_compositions_cover_every_exp_and_option():
    cases = set(PINNED)
    assert {f"{'adapt' if p.stem == 'toy_shift' else 'pipeline'} +exp={p.stem}"
            for p in (CONF / "exp").glob("*.yaml")} <= cases
    for g in GROUPS:
        for path in (CONF / g.name).glob("*.yaml"):
            default = OmegaConf.load(CONF / "common.yaml").defaults
            if {g.name: path.stem} not in default:
                assert f"pipeline {g.name}={path.stem}" in cases or path.stem in (
                    "aime25", "amc23", "hmmt25"), path  # the three are task=math's prompt and grader


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: g.name)
def test_a_section_is_typed_as_its_options_schema_and_holds_the_view(group):
    for path in sorted((CONF / group.name).glob("*.yaml")):
        section = compose("pipeline", [f"{group.name}={path.stem}"])[group.name]
        option = group.chosen(section)
        assert OmegaConf.get_type(section) is group.options[option], path
        assert set(section) == set(group.view_keys()), path


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: g.name)
def test_an_options_defaults_are_the_views(group):
    """A key shared by options has one default, so a section's values do not depend on
    which schema declares it; each schema's name is its option's."""
    view = OmegaConf.structured(group.view)
    for option, schema in group.options.items():
        own = OmegaConf.structured(schema)
        assert {k: v for k, v in OmegaConf.to_container(own).items() if k != "name"} == {
            k: OmegaConf.to_container(view)[k] for k in own if k != "name"}, option
        if group.name != "model":
            assert own.name == option


def test_an_option_schema_lacks_the_other_options_keys():
    task = {g.name: g for g in GROUPS}["task"]
    assert "shots" not in task.keys("arith") and "n_steps" not in task.keys("wordprob")
    assert task.readers("tokenize") == ["qa", "wordprob", "datatotext"]
    assert {g.name: g for g in GROUPS}["predictor"].readers("hidden") == ["mlp", "fusion", "conf_features",
                                                                          "hidden_conf"]


def test_an_options_yaml_sets_only_its_schemas_keys():
    """The shipped yamls pass the check that validate makes of a user's (next test)."""
    for g in GROUPS:
        for path in sorted((CONF / g.name).glob("*.yaml")):
            raw = OmegaConf.load(path)
            option = g.chosen(compose("collect", [f"{g.name}={path.stem}"])[g.name])
            extra = set(raw) - {"defaults"} - set(g.keys(option))
            assert not extra, f"{path}: {sorted(extra)} are not keys of {g.options[option].__name__}"


MYTASK = "defaults:\n  - arith_schema\n  - _self_\n\nname: arith\nn_steps: 4\nshots: {shots}\n"
ARITH_KEYS = "name, split_fractions, seed, stop, n_steps, operators, multipliers, styles, prompt_offset"


@pytest.mark.parametrize("shots", [3, 5])  # wordprob's default, and another value
def test_another_options_key_in_an_options_yaml_fails_naming_file_and_key(tmp_path, shots):
    """A section holds the view, so Hydra composes a key of another option (wordprob's
    shots) in a yaml that extends arith_schema; validate refuses it, at its default too."""
    (tmp_path / "task").mkdir()
    (tmp_path / "task" / "mytask.yaml").write_text(MYTASK.format(shots=shots))
    (tmp_path / "task" / "child.yaml").write_text("defaults:\n  - mytask\n  - _self_\n\nn_steps: 5\n")
    search = f"hydra.searchpath=[file://{tmp_path}]"
    for choice in ("mytask", "child"):  # the key set in the yaml an option extends is named too
        cfg = compose("collect", [f"task={choice}", search], return_hydra_config=True)
        assert cfg.task.shots == shots and OmegaConf.get_type(cfg.task).__name__ == "ArithTaskConfig"
        with pytest.raises(ConfigError) as e:
            validate(cfg)
        assert str(e.value) == (
            f"task.shots: set in {tmp_path}/task/mytask.yaml (task={choice}, which extends "
            f"arith_schema), but only task=wordprob|datatotext read it; task=arith's keys: {ARITH_KEYS}")
    (tmp_path / "task" / "mytask.yaml").write_text(MYTASK.replace("shots: {shots}\n", ""))
    validate(compose("collect", ["task=child", search], return_hydra_config=True))  # its own keys: fine


def test_a_stage_checks_the_option_files_it_was_composed_from(tmp_path, capsys):
    (tmp_path / "task").mkdir()
    (tmp_path / "task" / "mytask.yaml").write_text(MYTASK.format(shots=3))
    with pytest.raises(SystemExit) as e:
        run_stage("collect", ["logger=none", "task=mytask", f"hydra.searchpath=[file://{tmp_path}]",
                              f"paths.output_dir={tmp_path}/out", f"hydra.run.dir={tmp_path}/run"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: task.shots: set in {tmp_path}/task/mytask.yaml (task=mytask, ")
    assert not list(tmp_path.rglob("meta.json"))  # no artifact: refused before any compute


def test_every_group_option_is_a_registered_name():
    by_name = {g.name: tuple(g.options) for g in GROUPS}
    assert by_name["task"] == names("task")
    assert by_name["predictor"] == predictor_names()
    assert by_name["loss"] == names("loss")
    assert by_name["policy"] == names("policy")
    assert by_name["reward"] == names("reward")


def test_every_rule_names_real_stages_and_the_stage_decides_which_run():
    assert {OmegaConf.load(p).stage for p in CONF.glob("*.yaml") if "stage" in OmegaConf.load(p)} == set(STAGES)
    assert all(stages and set(stages) <= set(STAGES) for _, stages in RULES)
    # train needs train prompts in the bank; collect does not check it
    validate(compose("collect", ["collect.prompts.train=0"]))
    with pytest.raises(Exception, match="^collect.prompts.train: train needs train prompts"):
        validate(compose("train", ["collect.prompts.train=0"]))


def test_config_validates_without_importing_torch():
    code = f"""
import sys
from hydra import compose, initialize_config_dir
from stopexp.config import validate
from stopexp.core.names import lookup
with initialize_config_dir(config_dir={str(CONF)!r}, version_base="1.3"):
    for stage in ("collect", "train", "evaluate"):
        validate(compose(config_name=stage, overrides=["logger=none"]))
assert "torch" not in sys.modules, "validate imported torch"
assert lookup("loss", "mse").__name__ == "mse" and "torch" in sys.modules  # imported on lookup
"""
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_every_registered_name_looks_up_what_it_names():
    # each kind's targets import and are what their users call (a class or a function);
    # evaluate's method names are the registry's
    from stopexp.core.names import BASELINE_METHODS, REGISTRY, lookup
    from stopexp.signals import methods as M

    assert all(callable(lookup(kind, name)) for kind in REGISTRY for name in REGISTRY[kind])
    assert BASELINE_METHODS == names("baseline") == tuple(M.BASELINES)
    assert lookup("baseline", "entropy") is M.BASELINES["entropy"] and lookup("control", "oracle") is M.oracle

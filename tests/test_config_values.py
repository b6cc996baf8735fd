"""Every value out of its range (NaN and inf wherever a float is) fails at validate naming
its key; the checks follow the stages that will run, and evaluate's method names, beam
search's K and the output dirs are checked before any compute."""
import pytest

from conftest import compose
from stopexp.config import ConfigError, validate
from stopexp.config.predictor import PREDICTOR


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


# Every numeric key of the schema with values outside its range; NaN and inf everywhere a
# float is. Each message must start with the key.
BAD_VALUES = [
    # NaN / inf: caught by the generic finiteness walk, whatever the key
    ("search.temperature=nan", "search.temperature", "nan is not a finite number"),
    ("search.temperature=inf", "search.temperature", "inf is not a finite number"),
    ("tap.checkpoints=[0.08,nan]", "tap.checkpoints", "nan is not a finite number"),
    ("search.check_at=inf", "search.check_at", "inf is not a finite number"),
    ("task.styles.careful=nan", "task.styles.careful", "nan is not a finite number"),
    ("task.split_fractions.val=nan", "task.split_fractions.val", "nan is not"),
    ("train.lr=nan", "train.lr", "nan is not a finite number"),
    ("train.weight_decay=inf", "train.weight_decay", "inf is not"),
    ("train.checkpoint=nan", "train.checkpoint", "nan is not"),
    ("loss.margin=nan", "loss.margin", "nan is not a finite number"),
    ("loss.discount=-inf", "loss.discount", "-inf is not"),
    ("loss.length_reg=nan", "loss.length_reg", "nan is not"),
    ("policy.tau=nan", "policy.tau", "nan is not a finite number"),
    ("policy.quantile=nan", "policy.quantile", "nan is not"),
    ("policy.target_prune_rate=nan", "policy.target_prune_rate", "nan is not"),
    ("policy.gain=inf", "policy.gain", "inf is not"),
    ("search.top_p=nan", "search.top_p", "nan is not"),
    ("search.beam_checks=[nan]", "search.beam_checks", "nan is not"),
    ("predictor.dropout=nan", "predictor.dropout", "nan is not"),
    ("predictor.lora_alpha=inf", "predictor.lora_alpha", "inf is not"),
    ("model.toy.lr=nan", "model.toy.lr", "nan is not"),
    ("model.toy.target_accuracy=nan", "model.toy.target_accuracy", "nan is not"),
    ("model.toy.screen_temperature=inf", "model.toy.screen_temperature", "inf is not"),
    # ranges
    ("search.temperature=1e-38", "search.temperature", "must be >= 0.0001, got 1e-38"),
    ("search.temperature=0", "search.temperature", "must be >= 0.0001"),
    ("search.top_k=-1", "search.top_k", "must be >= 0, got -1"),
    ("search.max_new_tokens=1", "search.max_new_tokens", "must be >= 2, got 1"),
    ("search.beam_width=0", "search.beam_width", "must be >= 1, got 0"),
    ("search.patience=0", "search.patience", "must be >= 1"),
    ("search.conf_topk=0", "search.conf_topk", "must be >= 1"),
    ("search.group_window=0", "search.group_window", "must be >= 1"),
    ("search.max_batch_rows=0", "search.max_batch_rows", "must be >= 1"),
    ("search.check_at=-0.5", "search.check_at", "is not a position the features hold"),
    ("evaluate.bootstrap=0", "evaluate.bootstrap", "must be >= 1, got 0"),
    ("evaluate.bootstrap=-5", "evaluate.bootstrap", "must be >= 1, got -5"),
    ("evaluate.retention=[0]", "evaluate.retention", "K=0 must lie in 1..N=64"),
    ("evaluate.n_points=[65]", "evaluate.n_points", "N=65 must lie in 1..64"),
    ("train.patience=-1", "train.patience", "must be >= 1, got -1"),
    ("train.patience=0", "train.patience", "must be >= 1, got 0"),
    ("train.epochs=0", "train.epochs", "must be >= 1"),
    ("train.batch_prompts=0", "train.batch_prompts", "must be >= 1"),
    ("train.lr=0", "train.lr", "must lie in (0, inf)"),
    ("train.weight_decay=-0.1", "train.weight_decay", "must be >= 0"),
    ("loss.margin=-1", "loss.margin", "must be >= 0"),
    ("loss.discount=0", "loss.discount", "must lie in (0, 1]"),
    ("loss.discount=1.5", "loss.discount", "must lie in (0, 1]"),
    ("loss.length_reg=-1", "loss.length_reg", "must be >= 0"),
    ("policy.keep=0", "policy.keep", "retention K=0 must lie in 1..N=64"),
    ("policy.quantile=1", "policy.quantile", "must lie in (0, 1)"),
    ("policy.target_prune_rate=1", "policy.target_prune_rate", "must lie in [0, 1)"),
    ("policy.gain=-0.1", "policy.gain", "must be >= 0"),
    ("predictor.hidden=0", "predictor.hidden", "must be >= 1"),
    ("predictor.depth=-1", "predictor.depth", "must be >= 0"),
    ("predictor.dropout=1", "predictor.dropout", "must lie in [0, 1)"),
    ("predictor.lora_alpha=0", "predictor.lora_alpha", "must lie in (0, inf)"),
    ("predictor.layer=1", "predictor.layer", "1 is not a tapped layer; allowed: [2]"),
    ("predictor.layer=-2", "predictor.layer", "-2 is not a tapped layer"),
    ("model.max_batch_tokens=0", "model.max_batch_tokens", "must be >= 1"),
    ("model.max_prompt_tokens=0", "model.max_prompt_tokens", "must be >= 1"),
    ("model.long_prompts=truncate", "model.long_prompts", "'truncate' is not allowed"),
    ("model.dtype=float8", "model.dtype", "'float8' is not allowed"),
    ("model.toy.hidden_size=0", "model.toy.hidden_size", "must be >= 1"),
    ("model.toy.num_layers=0", "model.toy.num_layers", "must be >= 1"),
    ("model.toy.intermediate_size=0", "model.toy.intermediate_size", "must be >= 1"),
    ("model.toy.batch_size=0", "model.toy.batch_size", "must be >= 1"),
    ("model.toy.lr=0", "model.toy.lr", "must lie in (0, inf)"),
    ("model.toy.warmup_steps=-1", "model.toy.warmup_steps", "must be >= 0"),
    ("model.toy.max_steps=0", "model.toy.max_steps", "must be >= 1"),
    ("model.toy.eval_every=0", "model.toy.eval_every", "must be >= 1"),
    ("model.toy.screen_prompts=0", "model.toy.screen_prompts", "must be >= 1"),
    ("model.toy.screen_paths=0", "model.toy.screen_paths", "must be >= 1"),
    ("model.toy.target_accuracy=1.5", "model.toy.target_accuracy", "must lie in [0, 1]"),
    ("model.toy.screen_temperature=0", "model.toy.screen_temperature", "must be >= 0.0001"),
    ("model.toy.screen_max_new_tokens=1", "model.toy.screen_max_new_tokens", "must be >= 2"),
    ("task.n_steps=0", "task.n_steps", "must lie in 1..1000, got 0"),
    ("task.split_fractions.val=0", "task.split_fractions", "needs train, val, test > 0"),
    ("collect.prompts.train=-1", "collect.prompts.train", "must be >= 0"),
    ("collect.shard_prompts=0", "collect.shard_prompts", "must be >= 1"),
    ("collect.world=0", "collect.world", "must be >= 1"),
    ("collect.keep_correct_splits=[dev]", "collect.keep_correct_splits", "['dev'] unknown"),
    ("tap.layers=[a]", "tap.layers", "'a' is not a layer; give an index or one of first, mid, last"),
    ("tap.layers=[0.5]", "tap.layers", "0.5 is not a layer"),
    ("tap.layers=[true]", "tap.layers", "True is not a layer"),
    ("tap.layers=[3]", "tap.layers", "layer 3 is outside the model's 3 layers"),
    ("evaluate.seed=-1", "evaluate.seed", "must be >= 0, got -1"),
    ("seed=-3", "seed", "must be >= 0, got -3"),
    ("train.seed=-1", "train.seed", "must be >= 0"),
    ("model.toy.seed=-1", "model.toy.seed", "must be >= 0"),
    ("model.device=gpu", "model.device", "'gpu' is not a device; allowed: auto, cpu, mps, cuda"),
    # what only evaluate or train would find late
    ("evaluate.methods=[no_prune,nosuch]", "evaluate.methods", "'nosuch' unknown; allowed:"),
    ("evaluate.split=dev", "evaluate.split", "'dev' unknown; allowed: train, val, test"),
    ("collect.prompts.test=0", "evaluate.split", "the trace bank holds no 'test' prompts"),
    ("collect.prompts.val=0", "collect.prompts.val", "train needs val prompts"),
]


@pytest.mark.parametrize("override, key, message", BAD_VALUES)
def test_every_bad_value_names_its_key(override, key, message):
    with pytest.raises(ConfigError) as e:
        validate(compose("pipeline", [override]))
    assert str(e.value).startswith(key + ":"), str(e.value)
    assert message in str(e.value)


def test_every_float_of_the_schema_is_checked_for_finiteness():
    """Walk the schema: every float field (also in lists and dicts) set to NaN fails, named."""
    import dataclasses
    import typing

    from stopexp.config import Config

    def float_keys(schema, prefix):
        for f in dataclasses.fields(schema):
            hint = f.metadata.get("view") or typing.get_type_hints(schema)[f.name]  # a group's view
            inner = [a for a in typing.get_args(hint) if a is not type(None)]
            base = inner[0] if typing.get_origin(hint) is typing.Union and inner else hint
            if dataclasses.is_dataclass(base):
                yield from float_keys(base, f"{prefix}{f.name}.")
            elif base is float:
                yield f"{prefix}{f.name}", f"{prefix}{f.name}=nan"
            elif typing.get_origin(base) is list and typing.get_args(base) == (float,):
                yield f"{prefix}{f.name}", f"{prefix}{f.name}=[nan]"
            elif typing.get_origin(base) is dict and typing.get_args(base)[1] is float:
                yield f"{prefix}{f.name}.x", f"+{prefix}{f.name}.x=nan"

    keys = list(float_keys(Config, ""))
    assert len(keys) >= 20
    for key, override in keys:
        with pytest.raises(ConfigError) as e:
            validate(compose("pipeline", [override]))
        assert str(e.value) == f"{key}: nan is not a finite number", override


@pytest.mark.parametrize("predictor", PREDICTOR.readers("layer"))
def test_every_predictor_of_one_layer_refuses_an_untapped_layer(predictor):
    with pytest.raises(ConfigError) as e:
        validate(compose("train", [f"predictor={predictor}", "predictor.layer=5"]))
    assert str(e.value) == ("predictor.layer: 5 is not a tapped layer; allowed: [2] (tap.layers) or "
                            "-1..-1 counted from the deepest tapped layer")


@pytest.mark.parametrize("stage, override, key", [
    ("train", "evaluate.methods=[nosuch]", None),  # train does not evaluate
    ("collect", "evaluate.split=dev", None),
    ("collect", "predictor.layer=1", None),        # collect trains nothing
    ("evaluate", "evaluate.methods=[nosuch]", "evaluate.methods"),
    ("pipeline", "evaluate.methods=[nosuch]", "evaluate.methods"),
    ("train", "predictor.layer=1", "predictor.layer"),
    ("train", "collect.prompts.val=0", "collect.prompts.val"),
    ("evaluate", "collect.prompts.val=0", None),
])
def test_checks_follow_the_stages_that_will_run(stage, override, key):
    cfg = compose(stage, [override])
    if key is None:
        validate(cfg)
        return
    with pytest.raises(ConfigError, match=f"^{key}:"):
        validate(cfg)


def test_registered_external_scorer_passes_validation():
    from stopexp.signals.methods import _EXTERNAL, register_external

    with pytest.raises(ConfigError, match="'my_prm' unknown"):
        validate(compose("evaluate", ["evaluate.methods=[my_prm]"]))
    register_external("my_prm", lambda batch: batch["signals"][:, 0])
    try:
        validate(compose("evaluate", ["evaluate.methods=[my_prm]"]))
    finally:
        _EXTERNAL.pop("my_prm")


def test_beam_search_with_a_top_k_that_cannot_prune_is_refused():
    with pytest.raises(ConfigError) as e:
        validate(compose("evaluate", ["search=beam"]))
    assert str(e.value) == (
        "policy.keep: policy=topk keeps K=8 of at most search.beam_width=4 live beams, so beam "
        "search would never prune and every method would equal no_prune; use policy=quantile "
        "(as +exp=toy_beam does), policy=fixed or a K below the beam width")
    validate(compose("evaluate", ["search=beam", "policy.keep=3"]))
    validate(compose("collect", ["search=beam"]))  # collecting the bank does not prune


def test_unwritable_output_dirs_fail_before_compute(tmp_path):
    from stopexp.config import check_output_dirs

    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")  # even root cannot make a directory under a file
    cfg = compose("collect", [f"paths.output_dir={tmp_path / 'out'}",
                              f"paths.cache_dir={blocker / 'cache'}"])
    with pytest.raises(ConfigError) as e:
        check_output_dirs(cfg)
    assert str(e.value).startswith(f"paths.cache_dir: cannot write to {blocker / 'cache'} (")
    assert "point paths.cache_dir at a writable directory" in str(e.value)
    ok = compose("collect", [f"paths.output_dir={tmp_path / 'out'}"])
    check_output_dirs(ok)
    assert (tmp_path / "out" / "cache").is_dir() and not list((tmp_path / "out" / "cache").iterdir())

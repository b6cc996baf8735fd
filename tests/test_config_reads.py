"""What a user sets is what runs: keys an option does not read are refused, values relative
to N are derived from it, an exp's settings give way to the options a user picks, and the
oracle ranks as documented (what the stages report of it: tests/test_reported_protocol.py)."""
import logging

import pytest
import torch
from omegaconf import OmegaConf

from conftest import ROOT, compose
from stopexp.config import ALWAYS_METHODS, ConfigError, validate

# the README and the pages of the docs site (docs/): what they document is what the code does
README = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))])


@pytest.mark.parametrize("stage, overrides, key, says", [
    ("collect", ["model.path=/no/such/dir"], "model.path", "model=toy loads the embedded LM"),
    ("collect", ["model.gguf_file=x.gguf"], "model.gguf_file", "model=toy loads the embedded LM"),
    ("collect", ["model.num_layers=3"], "model.num_layers", "sized by model.toy"),
    ("collect", ["model.revision=main"], "model.revision", "read only by a hub or GGUF model"),
    ("collect", ["+exp=toy_datatotext", "model=smollm2"], "model.toy", "read only by model=toy"),
    ("collect", ["model=smollm2", "model.revision=main"], "model.revision", "read only with model.path"),
    ("collect", ["task.path=questions.jsonl"], "task.path", "read only by task=qa, not under task=arith"),
    ("collect", ["task=wordprob", "task.n_steps=8"], "task.n_steps", "read only by task=arith"),
    ("collect", ["task.shots=5"], "task.shots", "read only by task=wordprob|datatotext"),
    ("train", ["loss.discount=0.5"], "loss.discount", "read only by loss=mse, not under loss=contrastive"),
    ("train", ["loss=pairwise", "loss.margin=2"], "loss.margin", "read only by loss=contrastive"),
    ("evaluate", ["search.patience=3"], "search.patience", "read only by search=beam"),
    ("evaluate", ["evaluate.max_prompts=3"], "evaluate.max_prompts", "read only by search=beam"),
    ("train", ["predictor.lora_rank=4"], "predictor.lora_rank", "read only by predictor=super_token"),
    ("train", ["predictor.statistic=var"], "predictor.statistic", "read only by predictor=statistic"),
    ("evaluate", ["evaluate.methods=[confidence]", "evaluate.stopping.esc.window=4"],
     "evaluate.stopping.esc.window", "read only by the method esc"),
    ("evaluate", ["evaluate.methods=[esc]", "evaluate.stopping.adaptive_consistency.threshold=0.9"],
     "evaluate.stopping.adaptive_consistency.threshold", "read only by the method adaptive_consistency"),
    ("evaluate", ["policy=quantile", "evaluate.retention=[2,4]"], "evaluate.retention",
     "[2, 4] is read only by policy=topk, not under policy=quantile; leave it unset (default [4, 8, 16])"),
    ("pipeline", ["policy=fixed", "search.n_paths=8", "evaluate.retention=[2,4]"], "evaluate.retention",
     "not under policy=fixed; leave it unset (default [1, 3, 6])"),
    ("evaluate", ["+exp=toy_beam", "evaluate.retention=[2,4]"], "evaluate.retention",
     "not under policy=quantile"),
    ("evaluate", ["search=beam", "policy.keep=2", "evaluate.retention=[2,4]"], "evaluate.retention",
     "[2, 4]: search=beam reports one point per method, with no Pareto sweep to read it; leave "
     "evaluate.retention unset"),
    ("evaluate", ["+exp=toy_beam", "evaluate.n_points=[4,8]"], "evaluate.n_points",
     "search=beam reports one point per method"),
    ("evaluate", ["search.check_at=[0.08,0.25]", "evaluate.retention=[2,4]"], "evaluate.retention",
     "with several checks (search.check_at [0.08, 0.25]) each check keeps its K of policy.keep"),
    ("evaluate", ["policy=fixed", "policy.keep=4"], "policy.keep",
     "4 is read only by policy=topk, not under policy=fixed; leave it unset (default 8)"),
    ("evaluate", ["policy.tau=0.3"], "policy.tau", "read only by policy=fixed|adaptive, not under "
     "policy=topk"),
    ("evaluate", ["policy=fixed", "policy.quantile=0.9"], "policy.quantile",
     "read only by policy=quantile, not under policy=fixed"),
    ("evaluate", ["policy=quantile", "policy.target_prune_rate=0.9"], "policy.target_prune_rate",
     "read only by policy=adaptive"),
    ("train", ["policy.gain=0.2"], "policy.gain", "read only by policy=adaptive"),
    ("train", ["predictor=linear", "predictor.hidden=64"], "predictor.hidden",
     "64 is read only by predictor=mlp|fusion|conf_features|hidden_conf, not under predictor=linear"),
    ("pipeline", ["predictor=statistic", "predictor.dropout=0.1"], "predictor.dropout",
     "not under predictor=statistic"),
    ("train", ["predictor=statistic", "train.lr=0.1"], "train.lr", "0.1 is read only by "
     "a predictor other than statistic, not under predictor=statistic; "
     "leave it unset (default 0.001)"),
    ("pipeline", ["predictor=statistic", "train.epochs=5"], "train.epochs", "not under predictor=statistic"),
    ("train", ["predictor=statistic", "loss=mse"], "loss.name", "'mse' is read only by "
     "a predictor other than statistic, not under predictor=statistic"),
    ("evaluate", ["evaluate.text_metrics=false", "evaluate.bertscore_model=my/encoder"],
     "evaluate.bertscore_model", "'my/encoder' is read only with evaluate.text_metrics=true or "
     "evaluate.compare_beam=true"),
    ("collect", ["search.beam_width=8"], "search.beam_width", "8 is read only by search=beam or "
     "evaluate.compare_beam=true, not under search=parallel without compare_beam; leave it unset "
     "(default 4)"),
    ("evaluate", ["engine.block_size=64"], "engine.block_size", "64 is read only by engine=vllm or by "
     "STEP's budget (engine.kv_budget), not under engine=hf without engine.kv_budget; leave it "
     "unset (default 32)"),
    ("collect", ["search.score_rule=running_mean"], "search.score_rule", "'running_mean' is read only "
     "with several checks (search.check_at a list of prefixes), not with the one check "
     "search.check_at=0.08; leave it unset (default 'last')"),
    ("train", ["predictor=conf_features", "predictor.layer=5"], "predictor.layer", "5 is read only by "
     "predictor=statistic|linear|mlp|hidden_conf, not under predictor=conf_features; leave it unset "
     "(default -1)"),
    ("train", ["predictor=fusion", "predictor.layer=0"], "predictor.layer", "not under predictor=fusion"),
    ("collect", ["collect.keep_correct_splits=[train]"], "collect.keep_correct_splits", "['train'] is "
     "read only by collect.keep_correct set (a band [lo, hi]), not under collect.keep_correct=null; "
     "leave it unset (default ['train', 'val'])"),
])
def test_a_key_the_chosen_option_does_not_read_is_refused(stage, overrides, key, says):
    with pytest.raises(ConfigError) as e:
        validate(compose(stage, overrides))
    assert str(e.value).startswith(f"{key}: ") and says in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_the_same_keys_pass_under_the_options_that_read_them():
    validate(compose("train", ["loss=mse", "loss.discount=0.5"]))
    validate(compose("evaluate", ["search=beam", "policy=quantile", "search.patience=3"]))
    validate(compose("evaluate", ["evaluate.methods=[esc]", "evaluate.stopping.esc.window=4"]))
    validate(compose("collect", ["task=wordprob", "task.shots=5"]))
    validate(compose("evaluate", ["evaluate.retention=[2,4]"]))  # policy=topk, one check
    validate(compose("evaluate", ["search.beam_width=8", "evaluate.compare_beam=true"]))
    validate(compose("evaluate", ["search=beam", "policy=quantile", "search.beam_width=8"]))
    validate(compose("evaluate", ["policy=fixed", "policy.tau=0.3"]))
    validate(compose("evaluate", ["policy=adaptive", "policy.tau=0.3", "policy.gain=0.2",
                                  "policy.target_prune_rate=0.9"]))
    validate(compose("evaluate", ["policy=quantile", "policy.quantile=0.9"]))
    validate(compose("evaluate", ["policy.keep=4"]))
    validate(compose("train", ["predictor=fusion", "predictor.depth=2", "train.lr=0.01"]))
    validate(compose("train", ["predictor=statistic", "train.checkpoint=0.25"]))  # the prefix it scores
    validate(compose("evaluate", ["+exp=toy_beam", "policy=fixed"]))  # the exp's quantile drops
    validate(compose("evaluate", ["evaluate.methods=[learned,step]", "tap.positions.step_ends=true",
                                  "engine.kv_budget=4", "engine.block_size=64"]))
    validate(compose("evaluate", ["search.check_at=[0.08,0.25]", "policy.keep=[8,4]",
                                  "search.score_rule=running_mean"]))
    validate(compose("collect", ["collect.keep_correct=[1,63]", "collect.keep_correct_splits=[train]"]))


@pytest.mark.parametrize("overrides", [
    ["policy=quantile"], ["+exp=toy_beam"], ["search.check_at=[0.08,0.25]"],
    ["policy=quantile", "search.n_paths=8"],
    # a value equal to the one derived from N is the default, set or not
    ["policy=quantile", "search.n_paths=16", "evaluate.retention=[2,4,8]"],
    ["+exp=toy_beam", "search.n_paths=16", "evaluate.n_points=[4,8,16]"],
])
def test_a_derived_default_is_no_value_set(overrides):
    validate(compose("evaluate", overrides))


@pytest.mark.parametrize("stage", ["collect", "train"])
def test_a_keep_correct_band_without_mixed_prompts_is_refused_at_every_stage(stage):
    with pytest.raises(ConfigError, match=r"^collect.keep_correct: \[4, 4\] keeps only train/val "
                                          r"prompts whose N=4 paths all fail or all succeed"):
        validate(compose(stage, ["search.n_paths=4", "collect.keep_correct=[4,4]"]))
    with pytest.raises(ConfigError, match=r"^collect.keep_correct: \[1, 3\] filters no split"):
        validate(compose(stage, ["search.n_paths=4", "collect.keep_correct=[1,3]",
                                 "collect.keep_correct_splits=[]"]))
    validate(compose(stage, ["search.n_paths=4", "collect.keep_correct=[1,3]"]))


def test_evaluate_methods_lists_what_runs_besides_the_four_always_run(caplog):
    from stopexp.evaluation.method_names import method_names

    assert ALWAYS_METHODS == ("no_prune", "random", "confidence", "oracle")
    none = compose("evaluate", ["evaluate.methods=[]"])
    with caplog.at_level(logging.INFO, logger="stopexp.evaluation.method_names"):
        assert method_names(none.evaluate.methods, none.predictor.name) == list(ALWAYS_METHODS)
    assert "no_prune, random, confidence, oracle run too" in caplog.text
    # `learned` is the configured predictor
    linear = compose("evaluate", ["evaluate.methods=[learned,entropy]", "predictor=linear"])
    assert method_names(linear.evaluate.methods, linear.predictor.name) == [
        "no_prune", "random", "confidence", "oracle", "linear", "entropy"]
    assert "`evaluate.methods=[]` runs exactly these four" in README
    assert "`learned` is the configured predictor" in README


@pytest.mark.parametrize("override, key", [
    ("adapt.variants=[frozen,bogus]", "adapt.variants"),
    ("adapt.explore=0", "adapt.explore"),
])
def test_adapt_errors_name_their_own_key_not_the_target(override, key):
    with pytest.raises(ConfigError) as e:
        validate(compose("adapt", ["+exp=toy_shift", override]))
    assert str(e.value).startswith(f"{key}: "), str(e.value)


@pytest.mark.parametrize("n, keep, retention, n_points", [
    (64, 8, [4, 8, 16], [8, 32, 64]),   # the main job, as before the derivation
    (16, 4, [2, 4, 8], [4, 8, 16]),     # the committed 16-path experiments
    (8, 3, [1, 3, 6], [3, 4, 8]),
    (4, 2, [1, 2, 4], [2, 4]),
])
def test_values_relative_to_n_are_derived_from_it(n, keep, retention, n_points):
    cfg = validate(compose("pipeline", [f"search.n_paths={n}"]))
    assert (cfg.policy.keep, list(cfg.evaluate.retention), list(cfg.evaluate.n_points)) == (
        keep, retention, n_points)


def test_progressive_checks_derive_one_decreasing_k_per_check():
    cfg = validate(compose("evaluate", ["search.check_at=[0.08,0.25]"]))
    assert list(cfg.policy.keep) == [16, 8]
    cfg = validate(compose("evaluate", ["search.check_at=[0.08,0.25]", "policy=quantile"]))
    assert cfg.policy.keep == 8  # threshold policies take no list


def test_experiments_shrink_with_one_edit():
    for exp in ("toy_contrastive", "toy_shift", "toy_datatotext", "smollm2_contrastive"):
        cfg = validate(compose("pipeline", [f"+exp={exp}", "search.n_paths=8"]))
        assert cfg.policy.keep == 3 and max(cfg.evaluate.n_points) == 8
    # scripts/bench_retap.py's own example
    validate(compose("pipeline", ["+exp=toy_contrastive", "logger=none", "collect.prompts.train=40",
                                  "collect.prompts.val=10", "collect.prompts.test=10",
                                  "search.n_paths=32"]))


@pytest.mark.parametrize("override, key", [
    ("policy.keep=16", "policy.keep"),
    ("evaluate.retention=[16]", "evaluate.retention"),
    ("evaluate.n_points=[16]", "evaluate.n_points"),
])
def test_an_explicit_value_beyond_n_names_the_keys_to_change_together(override, key):
    with pytest.raises(ConfigError) as e:
        validate(compose("evaluate", ["search.n_paths=8", override]))
    msg = str(e.value)
    assert msg.startswith(f"{key}: ") and "change it with search.n_paths" in msg
    assert f"leave {key} unset: it is derived from search.n_paths" in msg


def test_replacing_an_exps_option_drops_the_exps_settings_for_the_old_one():
    assert compose("train", ["+exp=toy_datatotext"]).loss.min_gap == 0.05
    assert compose("train", ["+exp=toy_datatotext", "loss=pairwise"]).loss.min_gap == 0.05
    cfg = validate(compose("train", ["+exp=toy_datatotext", "loss=mse"]))
    assert cfg.loss.min_gap == 0.0
    with pytest.raises(ConfigError, match=r"^loss.min_gap: .*loss=contrastive\|pairwise, not under loss=mse"):
        validate(compose("train", ["+exp=toy_datatotext", "loss=mse", "loss.min_gap=0.05"]))
    assert compose("evaluate", ["+exp=toy_beam"]).search.patience == 1
    assert validate(compose("collect", ["+exp=toy_beam_every_step"])).search.patience == 4


def test_an_adapt_target_on_the_command_line_replaces_the_exps():
    assert dict(compose("adapt", ["+exp=toy_shift"]).adapt.target) == {
        "task.styles": {"careful": 0.8, "shortcut": 0.2}, "model.toy.seed": 1, "collect.mc_rollouts": 4}
    cfg = compose("adapt", ["+exp=toy_shift", "++adapt.target={task.n_steps:8}"])
    assert OmegaConf.to_container(cfg.adapt.target) == {"task.n_steps": 8}
    assert "`++adapt.target={task.n_steps:8}` replaces the exp's target" in README


def test_the_oracle_ranks_by_how_a_path_ends_not_by_its_monte_carlo_label():
    from stopexp.signals.methods import oracle

    # path 0 ends wrong but its prefix's rollouts mostly succeed; path 1 ends right
    batch = {"correct": torch.tensor([0.0, 1.0]), "reward": torch.tensor([0.0, 1.0]),
             "mc": torch.tensor([0.75, 0.25])}
    assert oracle(batch).argmax().item() == 1
    # a continuous reward: the best reward first, equal rewards the correct path first
    batch = {"correct": torch.tensor([0.0, 1.0, 0.0]), "reward": torch.tensor([0.9, 0.5, 0.5]),
             "mc": torch.full((3,), float("nan"))}
    assert torch.argsort(oracle(batch), descending=True).tolist() == [0, 1, 2]

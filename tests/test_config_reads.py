"""What a user sets is what runs: keys an option does not read are refused, values relative
to N are derived from it, an exp's settings give way to the options a user picks, and the
documented behaviour (oracle, answers_replay defaults, headers, README) is what the code does."""
import logging

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from conftest import CONF, ROOT, compose
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
     "64 is read only by predictor=mlp|fusion|conf_features, not under predictor=linear"),
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


def replay_of(*overrides):
    """answers_replay's metrics for `overrides`, validated as the stage does first."""
    from stopexp.stages.answers_replay import replay_bank

    return replay_bank(validate(compose("answers_replay", list(overrides))))


def test_answers_replay_derives_k_and_check_tokens_and_reads_the_bank_first():
    from stopexp.stopping.answers_bank import load_answers_bank
    from stopexp.stopping.branch_draws import CHECK_SHARE, derived_check_tokens

    fixture = str(ROOT / "tests" / "data" / "answers_bank.json")
    bank = load_answers_bank(fixture, "boxed")
    # the fixture's 22 branch lengths have the median 20.5: 0.15 x 20.5 = 3.075 -> 3
    assert CHECK_SHARE == 0.15 and derived_check_tokens(bank) == 3
    m = replay_of(f"bank={fixture}", "n=6", "shuffles=2")  # n below 8: no k needed
    assert (m["protocol"]["k"], m["protocol"]["check_tokens"]) == (2, 3)  # round(sqrt(6)) = 2
    assert m["methods"]["random"]["pruned_paths"] > 0  # the check falls inside the paths
    with pytest.raises(ConfigError, match=r"^k: 7 must be in 1..n=6 \(or leave k unset"):
        replay_of(f"bank={fixture}", "n=6", "k=7")
    with pytest.raises(Exception, match="does not exist"):  # the file is read before k is judged
        replay_of(f"bank={ROOT / 'no_such_bank.json'}", "n=6", "k=7")
    assert "`k` defaults to round(sqrt(n))" in README and "`check_tokens` to 15%" in README


def test_answers_replay_n_defaults_to_the_banks_branch_count_and_the_file_is_judged_first():
    bank = f"bank={ROOT / 'tests' / 'data' / 'answers_bank.json'}"  # 8, 6 and 6 branches
    m = replay_of(bank, "shuffles=2")
    assert (m["protocol"]["n"], m["protocol"]["k"]) == (6, 2)  # the fewest stored; round(sqrt(6))
    assert m["methods"]["no_prune"]["branches_launched"] == 6
    with pytest.raises(ConfigError, match=r"^k: 7 must be in 1..n=6 "):  # n from the bank
        replay_of(bank, "k=7")
    with pytest.raises(ConfigError, match=r"^n=7 branches per prompt: must be in 1..6 \(prompt 1 "):
        replay_of(bank, "n=7", "k=9")  # n, which k is judged against, first
    with pytest.raises(ConfigError, match=r"^seed: must be >= 0, got -1"):  # before the bank is read
        replay_of(f"bank={ROOT / 'no_such_bank.json'}", "n=7", "seed=-1")
    with pytest.raises(Exception, match="does not exist"):  # the file before what it bounds
        replay_of(f"bank={ROOT / 'no_such_bank.json'}", "n=7", "k=9")
    assert "`n` defaults to the bank's branch count" in README


def test_the_table_header_shows_every_progressive_check():
    from stopexp.evaluation.table import print_table

    row = {"accuracy": 1.0, "accuracy_ci": [1.0, 1.0], "avg_at_k": 1.0, "tokens_total": 10.0,
           "tokens_ratio": 1.0, "wall_s": 0.0}
    metrics = {"methods": {"no_prune": row}, "mode": "replay",
               "protocol": {"n": 64, "k": 8, "check_tokens": 5, "checks": [[5, 16], [16, 8]],
                            "prompts": 3, "split": "test"}}
    assert print_table(metrics).splitlines()[0] == (
        "Launch-Check-Resume 64 -> 16 at 5 tokens -> 8 at 16 tokens, 3 test prompts (replay)")
    metrics["protocol"]["checks"] = [[5, 8]]
    assert print_table(metrics).splitlines()[0] == (
        "Launch-Check-Resume 64 -> 8 at 5 tokens, 3 test prompts (replay)")


@pytest.mark.parametrize("policy, kept", [
    ("topk", "2"),
    ("fixed", "score >= 0.5 (policy=fixed)"),
    ("quantile", "score >= the 0.5 quantile of the live paths (policy=quantile)"),
    ("adaptive", "score >= tau, from 0.5 toward prune rate 0.5 (policy=adaptive, gain 0.1)"),
])
def test_the_header_says_what_the_policy_keeps(policy, kept):
    from stopexp.core.policies import policy_params
    from stopexp.evaluation.learning_curves import variants_table as adapt_table
    from stopexp.evaluation.table import print_table

    cfg = compose("evaluate", [f"policy={policy}", "search.n_paths=4"])
    row = {"accuracy": 1.0, "accuracy_ci": [1.0, 1.0], "avg_at_k": 1.0, "tokens_total": 10.0,
           "tokens_ratio": 1.0, "wall_s": 0.0}
    protocol = {"n": 4, "k": 2, "check_tokens": 5, "checks": [[5, 2]], "prompts": 3, "split": "test",
                "policy": policy, "policy_params": policy_params(cfg.policy)}
    metrics = {"methods": {"no_prune": row}, "mode": "replay", "protocol": protocol}
    assert print_table(metrics).splitlines()[0] == (
        f"Launch-Check-Resume 4 -> {kept} at 5 tokens, 3 test prompts (replay)")
    beam = {"methods": {"no_prune": {**row, "pruned": 0, "check_share": 0.0}}, "search": "beam", "protocol": {
        **protocol, "beam_width": 4, "patience": 1}}
    assert print_table(beam).splitlines()[0] == (
        f"Beam search B=4, patience 1, each step keeps {kept}, 3 test prompts")
    adapted = {"variants": {}, "target": {}, "protocol": {**protocol, "stream_prompts": 9,
                                                          "batch_prompts": 3}}
    assert adapt_table(adapted).splitlines()[0] == (
        f"Online adaptation to {{}}: 9 prompts in batches of 3, 4 -> {kept} at 5 tokens")


@pytest.mark.parametrize("policy, k", [("fixed", 2.5), ("quantile", 2.0), ("adaptive", 2.5)])
def test_a_threshold_policy_has_no_retention_sweep_its_point_is_its_run(policy, k):
    """evaluate.retention sweeps K, which only policy=topk reads: under a threshold policy
    each method's one point is its run, K what its rule kept per prompt (mean)."""
    from stopexp.core.policies import check_policies
    from stopexp.core.protocol import check_plan
    from stopexp.store.path_table import Paths
    from stopexp.evaluation.accounting import account_methods, pareto_points
    from stopexp.evaluation.table import print_table

    scores = torch.tensor([0.9, 0.6, 0.3, 0.1, 0.9, 0.8, 0.7, 0.1])  # fixed tau 0.5 keeps 2, 3
    paths = Paths(group=np.repeat([0, 1], 4), path_id=np.tile(np.arange(4), 2),
                  length=np.full(8, 20), correct=np.array([1, 0, 1, 0, 1, 1, 0, 0], bool),
                  answer=np.array(list("12121122"), dtype=object), text=np.array(["t"] * 8, dtype=object),
                  alive=np.ones(8, bool), batch={}, checks=[{}])
    cfg = compose("evaluate", [f"policy={policy}", "search.n_paths=4", "evaluate.bootstrap=10"])
    results, _, scored, points = account_methods(["no_prune", "mine"], {"mine": lambda b: scores},
                                                 {"mine": check_policies(cfg.policy, [(5, 4)])},
                                                 paths, check_plan(cfg.search, cfg.policy), {}, None, None, {},
                                                 cfg.search, cfg.policy, cfg.evaluate)

    def pareto_points_of(c):
        return pareto_points(paths, scored, 5, check_plan(c.search, c.policy), c.search, c.policy, c.evaluate)

    assert points == [{"method": "mine", "n": 4, "k": k, "accuracy": results["mine"]["accuracy"],
                       "tokens_total": results["mine"]["tokens_total"]}]
    assert results["mine"]["k"] == k and results["no_prune"]["k"] == 4
    assert {p["method"] for p in pareto_points_of(cfg)} == {"no_prune"}
    topk = compose("evaluate", ["search.n_paths=4", "evaluate.bootstrap=10"])
    assert {(p["method"], p["k"]) for p in pareto_points_of(topk)} >= {
        ("mine", 1), ("mine", 2), ("mine", 4)}  # the sweep over evaluate.retention [1, 2, 4]
    metrics = {"methods": results, "mode": "replay", "points": points + pareto_points_of(cfg),
               "protocol": {"n": 4, "k": 2, "check_tokens": 5, "prompts": 2, "split": "test",
                            "policy": policy, "policy_params": {"tau": 0.5, "quantile": 0.5,
                                                                "target_prune_rate": 0.5, "gain": 0.1}}}
    assert print_table(metrics).splitlines()[-1] == (
        f"  policy={policy} has no K to sweep: a method's point is its run, K the paths its rule "
        "kept per prompt (mean); evaluate.retention applies to policy=topk")
    assert "the retention sweep applies to `policy=topk` only" in " ".join(README.split())


def test_a_probe_used_at_a_check_it_was_not_trained_at_is_warned_about(caplog):
    from stopexp.config import check_plan, checkpoint_tokens
    from stopexp.evaluation.method_names import warn_off_checkpoint

    def warn(c, names):
        return warn_off_checkpoint(names, check_plan(c.search, c.policy), checkpoint_tokens(c.train.checkpoint,
                                   c.search.max_new_tokens), c.train.positions)

    cfg = compose("evaluate", ["search.check_at=[0.08,0.25]"])
    with caplog.at_level(logging.WARNING, logger="stopexp.evaluation.method_names"):
        msg = warn(cfg, ["no_prune", "mlp", "conf_features"])
    assert msg == ("mlp, conf_features trained at 5 tokens (train.checkpoint) score the check(s) "
                   "at [16] tokens too, outside their training distribution; train.positions=all "
                   "trains them at every stored position")
    assert caplog.text.count("outside their training distribution") == 1
    assert warn(cfg, ["no_prune", "confidence"]) is None
    one = compose("evaluate")
    assert warn(one, ["mlp"]) is None


def test_train_progress_shows_the_value_epochs_are_selected_by():
    from stopexp.training.fit import selection_name, selection_value

    assert (selection_name({"auroc": 0.7}), selection_value({"auroc": 0.7})) == ("val_auroc", 0.7)
    continuous = {"auroc": 0.7, "spearman_within": 0.4}
    assert (selection_name(continuous), selection_value(continuous)) == ("val_spearman", 0.4)


def _value(v) -> str:
    v = OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
    if isinstance(v, bool) or v is None:
        return {True: "true", False: "false", None: "null"}[v]
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_value(x)}" for k, x in v.items()) + "}"
    return str(v)


def _leaves(node, prefix=""):
    for key, value in node.items_ex(resolve=False):
        if OmegaConf.is_dict(value):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def experiment_table() -> list[str]:
    """The table of what each exp sets (docs/configuration.md): its group options and,
    resolved in its composed config, every key its file sets (logger tags aside)."""
    rows = ["| `+exp=` | options | settings |", "|---|---|---|"]
    for path in sorted((CONF / "exp").glob("*.yaml")):
        raw = OmegaConf.load(path)
        options = []
        for entry in raw.pop("defaults", []):
            if isinstance(entry, str):
                if entry != "_self_":
                    options.append(f"`+exp={entry}`")
            else:
                (group, choice), = entry.items()
                options.append(f"`{group.removeprefix('override /')}={choice}`")
        raw.pop("logger", None)
        cfg = compose("pipeline", [f"+exp={path.stem}"])
        settings = [f"`{k}={_value(OmegaConf.select(cfg, k))}`" for k in _leaves(raw)]
        rows.append(f"| `{path.stem}` | {' '.join(options)} | {' '.join(settings)} |")
    return rows


def test_the_docs_show_what_each_experiment_sets():
    lines = README.splitlines()
    start = lines.index("| `+exp=` | options | settings |")
    shown = lines[start:start + len(list((CONF / "exp").glob("*.yaml"))) + 2]
    expected = experiment_table()
    assert shown == expected, ("the table of the exps (docs/configuration.md) is stale; it should "
                               "read:\n" + "\n".join(expected))

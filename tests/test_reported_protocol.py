"""What the stages report of the protocol a config sets: answers_replay's derived k and
check tokens, the table's header per check and policy, a threshold policy's one point,
the warnings about a probe off its checkpoint and train's progress, and the docs' table
of what each experiment sets."""
import logging

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from conftest import CONF, ROOT, compose
from stopexp.config import ConfigError, validate

# the README and the pages of the docs site (docs/): what they document is what the code does
README = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))])


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
    return str(v).replace("\n", "\\n")  # a table row is one line


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

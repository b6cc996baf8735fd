"""Progressive Launch-Check-Resume (several checks, score rules) and the votes: the replay
from the bank equals the online run, and the pieces do what their docstrings say."""
import numpy as np
import pytest
import torch

from conftest import compose, featurized
from stopexp.config import ConfigError, check_plan, validate
from stopexp.core.policies import check_policies
from stopexp.core.voting import elect, rule_score, weights
from stopexp.store.path_table import Paths
from stopexp.evaluation.accounting import decide_by_checks, outcome
from stopexp.stages.evaluate import evaluate
from stopexp.stages.train import train_with_controls
from stopexp.stages import build

# no evaluate.retention: several checks sweep no K (validate refuses it there)
FAST = ["evaluate.n_points=[4,8]", "evaluate.bootstrap=50",
        "train.epochs=3", "evaluate.text_metrics=false",
        "evaluate.methods=[entropy,confidence,mlp]"]
THREE = "tap.checkpoints=[0.08,0.16,0.25]"


def cfg_for(bank, *extra, stage="evaluate"):
    return validate(compose(stage, [*bank, *FAST, *extra]))


@pytest.fixture(scope="module")
def trained3(small_bank, tmp_path_factory):
    """The small bank's config with features at three checkpoints (5, 10, 16 tokens),
    collected and trained once."""
    from stopexp.stages.collect import collect

    bank = [*small_bank, THREE]
    collect(build.collection(cfg_for(bank, stage="collect")))
    train_with_controls(featurized(cfg_for(bank, stage="train")), progress=False)
    return bank


PROTOCOLS = [  # (check_at, keep, score rule, vote)
    ("[0.08,0.25]", "[6,3]", "last", "majority"),
    ("[0.08,0.25]", "[6,3]", "running_mean", "weighted"),
    ("[0.08,0.16,0.25]", "[6,4,2]", "running_mean", "filtered"),
    ("[0.08,0.16,0.25]", "[5,3,2]", "last", "weighted"),
    ("0.08", "4", "last", "filtered"),
]


@pytest.mark.parametrize("check_at,keep,rule,vote", PROTOCOLS)
def test_progressive_replay_equals_online(trained3, check_at, keep, rule, vote):
    over = [f"search.check_at={check_at}", f"policy.keep={keep}", f"search.score_rule={rule}",
            f"evaluate.vote={vote}"]
    replay = evaluate(cfg_for(trained3, *over))
    online = evaluate(cfg_for(trained3, *over, "evaluate.mode=online"))
    assert replay["protocol"]["checks"] == online["protocol"]["checks"]
    assert len(replay["protocol"]["checks"]) == check_at.count(",") + 1
    # the paired statistics at every check in replay; online scores the first check only
    assert [[c["tokens"], c["k"]] for c in replay["paired"]["checks"]] == replay["protocol"]["checks"]
    assert [c["tokens"] for c in online["paired"]["checks"]] == [replay["protocol"]["checks"][0][0]]
    assert online["paired"]["accuracy_diff"] == replay["paired"]["accuracy_diff"]
    for name, r in replay["methods"].items():
        o = online["methods"][name]
        assert (o["accuracy"], o["tokens_total"]) == (r["accuracy"], r["tokens_total"]), name
        for key in ("peak_kv_bytes", "mean_peak_kv_bytes"):
            assert o[key] == r[key], (name, key)
    # the later checks pruned more: fewer tokens than stopping after the first check
    if "," in check_at:
        first = evaluate(cfg_for(trained3, f"search.check_at={check_at.split(',')[0][1:]}",
                                 f"policy.keep={keep.split(',')[0][1:]}",
                                 f"evaluate.vote={vote}"))["methods"]
        assert replay["methods"]["mlp"]["tokens_total"] < first["mlp"]["tokens_total"]


def test_one_check_is_todays_protocol(trained3):
    """A one-element list equals the plain single check (where running_mean would be the
    same score too, so it is refused as a key nothing reads)."""
    base = evaluate(cfg_for(trained3, "search.check_at=0.08", "policy.keep=4"))["methods"]
    for over in (["search.check_at=[0.08]", "policy.keep=[4]"],):
        m = evaluate(cfg_for(trained3, *over))["methods"]
        for name in base:
            assert (m[name]["accuracy"], m[name]["tokens_total"]) == (
                base[name]["accuracy"], base[name]["tokens_total"]), (over, name)


def test_a_check_between_checkpoints_reads_the_stride_positions(trained3, small_bank):
    """A check at a multiple of tap.positions.stride is read from the features' stride
    positions: the same decisions as with that prefix among tap.checkpoints (10 tokens:
    0.16 of 64), and no check elsewhere passes validation."""
    strided = [*small_bank, "tap.checkpoints=[0.08,0.25]", "tap.positions.stride=10"]
    train_with_controls(featurized(cfg_for(strided, stage="train")), progress=False)
    over = ["search.check_at=[0.08,0.16,0.25]", "policy.keep=[6,4,2]"]
    listed, read = (evaluate(cfg_for(bank, *over))["methods"] for bank in (trained3, strided))
    assert set(listed) == set(read)
    for name in listed:
        assert (read[name]["accuracy"], read[name]["tokens_total"]) == (
            listed[name]["accuracy"], listed[name]["tokens_total"]), name
    for extra, held in [((), "hold: tap.checkpoints [0.08, 0.25]"),
                        (("tap.positions.stride=3",), "or a multiple of tap.positions.stride=3")]:
        with pytest.raises(ConfigError, match="search.check_at") as e:
            cfg_for(small_bank, "tap.checkpoints=[0.08,0.25]", *extra, *over)
        assert str(e.value).endswith(held), str(e.value)


def _paths(alive_at):
    """One prompt, 4 paths of length 20 except path 0 (3 tokens); alive masks per check."""
    P = 4
    checks = [{"alive": torch.as_tensor(a)} for a in alive_at]
    return Paths(group=np.zeros(P, int), path_id=np.arange(P), length=np.array([3, 20, 20, 8]),
                 correct=np.array([True, True, False, False]),
                 answer=np.array(["7", "7", "2", "2"], dtype=object),
                 text=np.array(list("abcd"), dtype=object), alive=np.asarray(alive_at[0]),
                 batch=checks[0], checks=checks)


def test_decide_by_checks_prunes_at_each_check_with_the_running_mean():
    alive = [[False, True, True, True], [False, True, True, False]]  # path 3 ends at 8 tokens
    paths = _paths(alive)
    cfg = compose("evaluate", ["policy=topk", "search.n_paths=4", "policy.keep=[2,1]",
                               "search.check_at=[5,10]", "tap.checkpoints=[5,10]",
                               "evaluate.n_points=[4]"])
    validate(cfg)
    plan = check_plan(cfg.search, cfg.policy)
    assert plan == [(5, 2), (10, 1)]
    scores = [np.array([0.0, 1.0, 3.0, 2.0]), np.array([0.0, 4.0, -1.0, 9.0])]
    last = decide_by_checks(paths, scores, check_policies(cfg.policy, plan), [5, 10], 4, "last")
    # check 1 keeps paths 2, 3; path 3 ends before check 2, so path 2 alone is checked: kept
    assert last.kept.tolist() == [False, False, True, True]
    assert last.pruned_at.tolist() == [0, 5, 0, 0]
    assert np.isnan(last.signal[0]) and last.signal[1:].tolist() == [1.0, -1.0, 2.0]
    mean = decide_by_checks(paths, scores, check_policies(cfg.policy, plan), [5, 10], 4,
                            "running_mean")
    assert mean.signal[2] == pytest.approx(1.0)  # (3 + -1) / 2
    o = outcome(paths, last.kept, last.pruned_at, 4)
    assert o["tokens"].tolist() == [3 + 5 + 20 + 8] and o["pruned_at"].tolist() == [5]
    assert rule_score([1.0, 2.0, 6.0], "running_mean") == 3.0 and rule_score([1.0, 2.0], "last") == 2.0


def test_votes_and_what_unscored_paths_get():
    answers = ["7", "2", "2", "2", "7"]
    nan = float("nan")
    signal = np.array([nan, -3.0, -3.0, -3.0, 4.0])  # path 0 ended before the first check
    assert elect(answers) == "2"  # majority
    assert elect(["7", "2", "2", "7"]) == "7"  # a tie goes to the answer seen first
    # weighted: sigmoid(4) + the mean weight (path 0) beats 3 * sigmoid(-3)
    w = weights(np.array([-3.0, 4.0, 2.0]))
    assert w.tolist() == pytest.approx([0.0474259, 0.9820138, 0.8807971], abs=1e-6)
    assert elect(answers, signal, "weighted") == "7"
    assert elect(answers[1:3] + ["7"], np.array([-3.0, -3.0, nan]), "weighted") == "2"
    # no scored voter: weighted is the majority
    assert elect(["7", "2", "2"], np.full(3, nan), "weighted") == "2"
    # filtered: the top half (ceil(0.5 * 4) = 2: paths 4 and 1, the earlier of the tied)
    # of the scored voters, plus the unscored path 0
    assert elect(answers, signal, "filtered", 0.5) == "7"
    assert elect(answers, signal, "filtered", 1.0) == "2"
    assert elect(["2", "5", "5"], np.array([nan, 1.0, 0.5]), "filtered", 0.25) == "2"  # tie: first seen
    with pytest.raises(ValueError, match="evaluate.vote: 'borda' unknown; allowed: majority, weighted, filtered"):
        elect(answers, signal, "borda")


@pytest.mark.parametrize("overrides,key,msg", [
    (["search.check_at=[0.25,0.08]"], "search.check_at", "checks must be increasing prefixes"),
    (["search.check_at=[0.08,0.5]"], "search.check_at", "0.5 is not a position the features hold: tap.checkpoints"),
    (["search.check_at=[]"], "search.check_at", "give a prefix"),
    (["search.check_at=[0.08,0.25]", "policy.keep=[4,2,1]"], "policy.keep",
     "3 values for the 2 checks of search.check_at [0.08, 0.25]; give one K per check"),
    (["policy.keep=[9]"], "policy.keep", "retention K=9 must lie in 1..N=8"),
    (["policy.keep=two"], "policy.keep", "'two' is not a whole number; give an integer"),
    (["search=beam", "search.check_at=[0.08,0.25]"], "search.check_at",
     "are a Launch-Check-Resume protocol of evaluate (search=parallel); search=beam takes one"),
    (["search.score_rule=median"], "search.score_rule", "allowed: last, running_mean"),
    (["search.check_at=[0.08]", "policy.keep=[4]", "search.score_rule=running_mean"],
     "search.score_rule", "'running_mean' is read only with several checks"),
    (["evaluate.vote=borda"], "evaluate.vote", "allowed: majority, weighted, filtered"),
    (["evaluate.vote_top=0"], "evaluate.vote_top", "must lie in (0, 1]"),
    (["search=beam", "policy=quantile", "evaluate.vote=weighted"], "evaluate.vote",
     "beam search returns one hypothesis per prompt"),
    (["search=beam", "policy=quantile", "search.score_rule=running_mean"], "search.score_rule",
     "beam search acts on each step's score"),
])
def test_bad_checks_and_votes_fail_naming_the_key(overrides, key, msg):
    with pytest.raises(ConfigError, match=key) as e:
        validate(compose("evaluate", ["search.n_paths=8", "evaluate.n_points=[8]",
                                      "policy.keep=${stopexp_where_read:policy.keep,4}", *overrides]))
    assert msg in str(e.value)


def test_replay_refuses_checks_the_features_lack(small_bank):
    from stopexp.evaluation.accounting import replay_paths
    from stopexp.store import bank
    from stopexp.store import feature_sets

    cfg = compose("evaluate", small_bank)  # the bank alone: no evaluate settings needed
    with pytest.raises(ValueError, match=r"no position 10 .*add it to tap.checkpoints or tap.positions"):
        replay_paths(bank.require_bank(build.bank(cfg)), feature_sets.require_features(build.feature_set(cfg)), "test", [5, 10])

"""The open-ended experiment end to end at a tiny size: data-to-text on the committed toy
LM, paths rewarded by ROUGE-L, Monte Carlo labels as mean rewards, selection by signal,
the plain-beam comparison, and replay equal to online."""
import numpy as np
import pytest

from conftest import compose, featurized
from stopexp.config import validate
from stopexp.stages.evaluate import evaluate, print_table
from stopexp.stages.train import train_with_controls
from stopexp.store import bank
from stopexp.stages.collect import collect
from stopexp.tasks import build_task
from stopexp.tasks.rewards import Reward
from stopexp.stages import build

TINY = ["+exp=toy_datatotext", "logger=none", "search.n_paths=8", "collect.prompts.train=8",
        "collect.prompts.val=4", "collect.prompts.test=4", "collect.shard_prompts=8",
        "collect.mc_rollouts=2", "search.max_batch_rows=256", "policy.keep=3",
        "evaluate.retention=[2,3]", "evaluate.n_points=[4,8]", "evaluate.bootstrap=50",
        "train.epochs=3"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("d2t") / "outputs"
    overrides = [f"paths.output_dir={out}", *TINY]
    collect(build.collection(validate(compose("collect", overrides))))
    train_with_controls(featurized(validate(compose("train", overrides))), progress=False)
    return overrides


def test_bank_stores_rewards_and_mean_reward_mc_labels(trained):
    cfg = validate(compose("collect", trained))
    ds = bank.load_bank(build.bank(cfg).root, "test")
    task = build_task(cfg.task)
    problems = task.problems("test", 4)
    texts = list(ds["text"][:])
    owned = [problems[int(i)] for i in ds["prompt_id"][:]]
    want = Reward("rouge_l").scores(task, owned, texts)
    assert np.asarray(ds["reward"][:]) == pytest.approx(want, abs=1e-6)  # float32 in the bank
    assert 0 < want.std() and not set(np.round(want, 6)) <= {0.0, 1.0}  # a real spread
    mc = ds["mc"][:]
    at = bank.read_meta(build.bank(cfg).root)["checkpoints"]  # where the Monte Carlo labels are
    alive = np.asarray(ds["length"][:])[:, None] > np.asarray(at)[None, :]
    assert np.isfinite(mc).all()
    assert mc[~alive] == pytest.approx(np.repeat(np.asarray(ds["reward"][:])[:, None], mc.shape[1], 1)[~alive])
    # mean of two rollouts' ROUGE-L: not a success rate in {0, .5, 1}
    assert not set(np.round(mc[alive], 6)) <= {0.0, 0.5, 1.0}


def test_selection_replay_equals_online_and_compares_with_beam(trained, tmp_path):
    replay = evaluate(validate(compose("evaluate", [*trained, "evaluate.text_metrics=false"])),
                      run_dir=tmp_path)
    assert (tmp_path / "reward_tokens.png").exists() and (tmp_path / "pareto.png").exists()
    online = evaluate(validate(compose("evaluate", [*trained, "evaluate.text_metrics=false",
                                                    "evaluate.compare_beam=false",
                                                    "evaluate.mode=online"])))
    assert replay["select"] == online["select"] == "signal"
    for name, r in replay["methods"].items():
        o = online["methods"][name]
        if name == "oracle":  # replay ranks by the ROUGE-L reward, online by the outcome
            continue
        for key in ("accuracy", "tokens_total", "mean_reward", "avg_reward_at_k"):
            assert o[key] == r[key], (name, key)
        if name != "no_prune":
            for key in ("spearman_within", "kendall_within", "auroc_above_median"):
                assert o[key] == r[key], (name, key)
    m = replay["methods"]
    assert m["oracle"]["spearman_within"] > 0.3 and -1 <= m["mlp"]["kendall_within"] <= 1
    beam = replay["beam_search"]
    assert beam["tokens_total"] > 0 and 0 <= beam["mean_reward"] <= 1
    assert all(0 <= r["text_vs_beam"]["rougeL"] <= 1 for r in m.values() if "text_vs_beam" in r)
    assert "selection by signal" in print_table(replay)
    oracle = evaluate(validate(compose("evaluate", [*trained, "evaluate.text_metrics=false",
                                                    "evaluate.compare_beam=false",
                                                    "evaluate.select=oracle"])))["methods"]
    for name, r in oracle.items():  # the best reward among a method's finishing paths
        assert r["mean_reward"] >= m[name]["mean_reward"] - 1e-12, name


def test_neg_perplexity_bank_reads_the_token_logprobs(tmp_path):
    overrides = [f"paths.output_dir={tmp_path}", *TINY, "reward=neg_perplexity",
                 "collect.prompts.train=2", "collect.prompts.val=0", "collect.prompts.test=0"]
    cfg = validate(compose("collect", overrides))
    collect(build.collection(cfg))
    ds = bank.load_bank(build.bank(cfg).root)
    want = [-np.exp(-np.mean(lp)) for lp in ds["token_logprob"][:]]
    assert np.asarray(ds["reward"][:]) == pytest.approx(want, rel=1e-6)
    mc = ds["mc"][:]
    alive = np.asarray(ds["length"][:])[:, None] > np.asarray(bank.read_meta(build.bank(cfg).root)["checkpoints"])
    # rollouts' mean -perplexity (prefix and continuation log-probs together): <= -1
    assert np.isfinite(mc).all() and (mc <= -1 + 1e-6).all() and alive.any()

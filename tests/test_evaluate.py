import json
import shlex
import numpy as np
import pytest
import torch

from conftest import compose, run_stage
from stopexp.config import validate
from stopexp.core.names import names
from stopexp.config.stopping import methods_on
from stopexp.core.policies import TopK
from stopexp.store.path_table import Paths
from stopexp.evaluation.accounting import keep_by_policy, outcome
from stopexp.signals.methods import random_scorer, register_external
from stopexp.stages.evaluate import evaluate, print_table
from stopexp.stages.train import train_with_controls

FAST = ["evaluate.n_points=[4,8]", "evaluate.retention=[2,4]", "policy.keep=4",
        "evaluate.bootstrap=200", "train.epochs=3"]


# beam search has no Pareto sweep: it reads neither evaluate.retention nor evaluate.n_points
# (nor, under toy_beam's policy=quantile, a K)
BEAM = ["+exp=toy_beam", *(o for o in FAST if not o.startswith(("evaluate.retention=",
                                                                 "evaluate.n_points=", "policy.keep=")))]


def cfg_for(small_bank, *extra, stage="evaluate"):
    return validate(compose(stage, [*small_bank, *FAST, *extra]))


def beam_cfg(small_bank, *extra):
    return validate(compose("evaluate", [*small_bank, *BEAM, *extra]))


@pytest.fixture(scope="module")
def trained(small_bank):
    train_with_controls(cfg_for(small_bank, stage="train"), progress=False)
    return small_bank


def test_replay_metrics_follow_the_contract(trained, tmp_path):
    m = evaluate(cfg_for(trained, "evaluate.text_metrics=false"), run_dir=tmp_path)
    methods = m["methods"]
    for name in ("no_prune", "random", "confidence", "oracle", "entropy", "deepconf",
                 "hidden_norm", "st_bon", "conf_features", "mlp"):
        r = methods[name]
        assert {"accuracy", "tokens_total", "wall_s", "avg_at_k", "accuracy_ci"} <= set(r)
        if name != "no_prune":
            assert {"auroc", "auroc_pooled", "auprc"} <= set(r)
    assert methods["oracle"]["auroc_pooled"] > 0.95
    assert methods["no_prune"]["tokens_ratio"] == 1.0
    assert all(r["tokens_total"] <= methods["no_prune"]["tokens_total"] for r in methods.values())
    for fig in ("pareto", "survival", "prune_steps", "signal_histograms", "analyses"):
        assert (tmp_path / f"{fig}.png").exists()
    records = [json.loads(line) for line in (tmp_path / "prompts.jsonl").read_text().splitlines()]
    for name, r in methods.items():  # each method's answer per prompt, as its summary counts them
        mine = [x for x in records if x["method"] == name]
        assert len(mine) == m["protocol"]["prompts"] and len({x["prompt_id"] for x in mine}) == len(mine)
        assert np.mean([x["correct"] for x in mine]) == pytest.approx(r["accuracy"])
        assert sum(x["tokens"] for x in mine) == r["tokens_total"]
    # not run by default: combined, and step (it needs engine.kv_budget)
    stopping = [s for s in methods_on("traces") if s not in ("combined", "step")]
    assert {p["method"] for p in m["points"]} >= {"no_prune", "mlp", "random", "st_bon", *stopping}
    for name in stopping:  # their own stopping protocols, replayed from the bank
        assert methods[name]["replayed"] and "auroc" not in methods[name]
    assert methods["deepconf_weighted"]["tokens_total"] == methods["no_prune"]["tokens_total"]
    for name, r in methods.items():  # the analyses
        assert {"wrongly_pruned", "pruned_paths", "vs_no_prune"} <= set(r)
        v = r["vs_no_prune"]
        assert v["improved"] + v["worsened"] + v["unchanged"] == m["protocol"]["prompts"]
    assert methods["no_prune"]["wrongly_pruned"] is None and methods["no_prune"]["pruned_paths"] == 0
    assert methods["oracle"]["wrongly_pruned"] < methods["random"]["wrongly_pruned"]
    assert 0 <= methods["mlp"]["auroc_length_matched"] <= 1 and methods["mlp"]["length_matched_pairs"] > 0
    header, *rows = print_table(m).splitlines()[1:1 + len(methods) + 1]
    assert {len(r) for r in rows} == {len(header)}  # long names keep the columns aligned
    assert any(r.startswith("adaptive_consistency  ") for r in rows)
    for key in ("tokens_total", "accuracy", "peak_kv_bytes"):  # one window of all N = 8 paths
        assert methods["esc"][key] == methods["no_prune"][key]
    peak = {name: r["peak_kv_bytes"] for name, r in methods.items()}
    assert peak["adaptive_consistency"] < peak["random"] < peak["no_prune"]  # one path at a time
    assert peak["deepconf_weighted"] == peak["no_prune"]
    assert all(0 < r["mean_peak_kv_bytes"] <= r["peak_kv_bytes"] for r in methods.values())
    assert {"hidden_mean", "hidden_var"} <= set(methods)  # in the default list


def test_replay_equals_online(trained):
    replay = evaluate(cfg_for(trained, "evaluate.text_metrics=false"))["methods"]
    online = evaluate(cfg_for(trained, "evaluate.text_metrics=false", "evaluate.mode=online"))["methods"]
    assert not online["deepconf_online"]["replayed"]  # its early stop runs inside the engine
    assert online["deepconf_online"]["pruned_paths"] > 0
    for name in replay:
        assert online[name]["accuracy"] == replay[name]["accuracy"], name
        assert online[name]["tokens_total"] == replay[name]["tokens_total"], name
        for key in ("peak_kv_bytes", "mean_peak_kv_bytes", "pruned_paths", "mean_prune_step"):
            assert online[name].get(key) == replay[name].get(key), (name, key)  # the schedule's estimate is exact
        assert replay[name]["kv_estimated"]
        if online[name].get("replayed"):  # stopping protocols replay the bank in both modes
            assert name in names("stopping") and online[name]["wall_estimated"]
            continue
        assert online[name]["wall_s"] > 0 and 0 <= online[name]["check_share"] < 1
        assert not online[name]["kv_estimated"]  # measured from the engine's live rows
    assert online["no_prune"]["paths_off_bank"] == online["confidence"]["paths_off_bank"] == 0


def test_an_online_path_off_the_bank_gets_no_reward_from_it(small_bank):
    """A path whose online text differs from the bank's (vLLM recomputes a preempted
    request's cache in other roundings) carries NaN, not the bank's reward; the rest do."""
    from dataclasses import replace

    from stopexp.evaluation.accounting import replay_paths
    from stopexp.evaluation.select import attach_bank_columns
    from stopexp.stages import build

    root = build.bank(cfg_for(small_bank)).root
    paths = replay_paths(root, None, "test", 5)
    changed = paths.text.copy()
    changed[3] = changed[3] + " 7"
    views = {"no_prune": (paths, None), "off": (replace(paths, text=changed), None)}
    assert attach_bank_columns(views, root, "test") == {"no_prune": 0, "off": 1}
    same, off = views["no_prune"][0], views["off"][0]
    assert np.isnan(off.reward[3]) and np.isnan(off.lm_score[3]) and not np.isnan(same.reward[3])
    rest = np.arange(len(same.text)) != 3
    np.testing.assert_array_equal(off.reward[rest], same.reward[rest])


def test_text_metrics_are_reported(trained):
    m = evaluate(cfg_for(trained, "evaluate.methods=[confidence]"))["methods"]
    t = m["no_prune"]["text_vs_no_prune"]
    assert t["bleu"] == pytest.approx(100.0) and t["bertscore"] > 0.99
    assert 0 < m["confidence"]["text_vs_reference"]["bleu"] <= 100
    assert t["level"] == "char" and t["empty_hypotheses"] == 0 and t["truncated"] == 0  # arith: characters


def test_unknown_method_and_missing_predictor_fail_before_compute(trained, tmp_path):
    with pytest.raises(ValueError, match="evaluate.methods: 'psychic' unknown"):
        evaluate(cfg_for(trained, "evaluate.methods=[psychic]"))
    with pytest.raises(FileNotFoundError, match="python -m stopexp.train"):
        # a training seed no other test trains with: the predictor is missing in any test order
        evaluate(cfg_for(trained, "predictor=linear", "train.seed=987654"))


def test_the_stage_prints_the_train_command_with_the_command_lines_overrides(trained, tmp_path,
                                                                           capsys):
    over = [*trained, *FAST, "predictor=linear", "train.seed=987655"]  # no test trains this seed
    with pytest.raises(SystemExit) as e:
        run_stage("evaluate", [*over, f"hydra.run.dir={tmp_path}"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    words = shlex.join(over)  # quoted for the shell: [4,8] is a glob
    assert f"; make it with: python -m stopexp.train {words} (or python -m stopexp.pipeline " \
           f"{words}, which makes what it needs too)\n" in err


def test_external_scorer_plugs_in(trained):
    register_external("longest_prefix_text", lambda b: b["signals"][:, -1] * 0 + torch.arange(len(b["signals"])).float())
    m = evaluate(cfg_for(trained, "evaluate.methods=[longest_prefix_text]", "evaluate.text_metrics=false"))
    assert "longest_prefix_text" in m["methods"]


def test_nonfinite_external_scores_are_ranked_and_counted(trained):
    def flaky(b):  # a plugged-in scorer that returns NaN and infinities for some paths
        s = b["signals"][:, -1].double().clone()
        s[::5], s[1::7], s[2::11] = float("nan"), float("inf"), float("-inf")
        return s

    register_external("flaky", flaky)
    m = evaluate(cfg_for(trained, "evaluate.methods=[flaky]", "evaluate.text_metrics=false"))["methods"]
    r = m["flaky"]
    assert r["nonfinite_scores"] > 0 and m["confidence"]["nonfinite_scores"] == 0
    assert all(np.isfinite(r[k]) for k in ("auroc", "auroc_pooled", "auprc", "accuracy"))


def test_an_external_scorer_that_raises_is_one_line_naming_it():
    from stopexp.core.errors import ConfigError
    from stopexp.stages.scorers import users_scorer

    def broken(batch):  # the user's scorer fails on the batch
        return batch["no_such_column"]

    with pytest.raises(ConfigError) as e:
        users_scorer("my_prm", broken)({"signals": torch.zeros(2, 3)})
    assert str(e.value) == ("evaluate.methods: the scorer 'my_prm' (register_external) raised "
                            "KeyError: 'no_such_column'; fix it (STOPEXP_DEBUG=1 shows the "
                            "traceback) or leave it out of evaluate.methods")
    assert users_scorer("numpy_prm", lambda b: np.arange(3.0))({}).tolist() == [0.0, 1.0, 2.0]


def _synthetic(G=300, n=16, seed=0):
    rng = np.random.default_rng(seed)
    correct = rng.random(G * n) < 0.4
    return Paths(group=np.repeat(np.arange(G), n), path_id=np.tile(np.arange(n), G),
                 length=np.full(G * n, 30), correct=correct,
                 answer=np.where(correct, "1", rng.integers(2, 9, G * n).astype(str)).astype(object),
                 text=np.asarray(["t"] * (G * n), dtype=object), alive=np.ones(G * n, bool),
                 batch={"seed_key": [f"{g}/{j}" for g in range(G) for j in range(n)]})


def test_random_pruning_keeps_avg_at_n():
    paths = _synthetic()
    full = outcome(paths, paths.alive, 6, 16)["avg"].mean()
    kept = keep_by_policy(paths, random_scorer(0)(paths.batch).numpy(), TopK(4), 16)
    assert kept.reshape(300, 16).sum(1).tolist() == [4] * 300
    assert abs(outcome(paths, kept, 6, 16)["avg"].mean() - full) < 0.03


def test_accounting_and_early_finishers_vote():
    paths = Paths(group=np.zeros(4, int), path_id=np.arange(4), length=np.array([3, 20, 20, 20]),
                  correct=np.array([True, True, False, False]),
                  answer=np.array(["7", "7", "2", "2"], dtype=object),
                  text=np.array(["a", "b", "c", "d"], dtype=object),
                  alive=np.array([False, True, True, True]), batch={})
    kept = np.array([False, True, False, False])
    o = outcome(paths, kept, 5, 4)
    assert o["tokens"].tolist() == [3 + 20 + 5 + 5] and o["correct"].tolist() == [True]
    assert o["chosen"].tolist() == ["a"] and o["pruned_at"].tolist() == [5, 5]
    everything = outcome(paths, paths.alive, 5, 4)
    assert everything["tokens"].tolist() == [63] and everything["correct"].tolist() == [True]  # tie: first seen
    assert outcome(paths, kept, 5, 2)["tokens"].tolist() == [23]


def test_beam_search_evaluation(trained):
    cfg = beam_cfg(trained, "search.beam_width=2", "search.max_new_tokens=64",
                   "evaluate.methods=[confidence,oracle]")
    m = evaluate(cfg)
    assert m["search"] == "beam" and set(m["methods"]) >= {"no_prune", "random", "confidence", "oracle"}
    assert m["methods"]["no_prune"]["pruned"] == 0
    assert m["methods"]["oracle"]["accuracy"] >= m["methods"]["no_prune"]["accuracy"]
    for r in m["methods"].values():
        assert r["tokens_total"] > 0 and len(r["survival"]) == 64
        assert 0 <= r["text_vs_reference"]["bleu"] <= 100 + 1e-9  # beam outputs get text metrics too
    assert m["methods"]["no_prune"]["text_vs_no_prune"]["bleu"] == pytest.approx(100.0)
    assert set(m["not_reported"]) == {"auroc", "avg_at_k"} and m["omitted_methods"] == {}


def test_beam_search_omits_stopping_protocols_and_runs_st_bon(trained):
    cfg = beam_cfg(trained, "search.beam_width=2", "search.max_new_tokens=64",
                   "evaluate.methods=[st_bon,esc,deepconf_online]", "evaluate.text_metrics=false")
    m = evaluate(cfg)
    assert set(m["omitted_methods"]) == {"esc", "deepconf_online"}
    assert "beam search has none" in m["omitted_methods"]["esc"]
    assert "st_bon" in m["methods"] and "esc" not in m["methods"]


def test_beam_search_batches_prompts_and_narrows_without_refill(trained):
    """Beams of many prompts in one forward decide as one prompt at a time (the quantile
    policy has no state); without refill the beam narrows and spends fewer tokens."""
    runs = {}
    for rows, refill in ((2, "true"), (1024, "true"), (1024, "false")):
        cfg = beam_cfg(trained, "search.beam_width=2", "search.beam_checks=null",
                       f"search.max_batch_rows={rows}", f"search.refill={refill}",
                       "evaluate.methods=[confidence]", "evaluate.text_metrics=false")
        runs[rows, refill] = evaluate(cfg)
    one, batched, narrow = runs[2, "true"], runs[1024, "true"], runs[1024, "false"]
    for name, r in one["methods"].items():
        for key in ("accuracy", "tokens_total", "pruned", "survival"):
            assert batched["methods"][name][key] == r[key], (name, key)
    assert narrow["protocol"]["refill"] is False and batched["protocol"]["refill"] is True
    c, base = narrow["methods"]["confidence"], narrow["methods"]["no_prune"]
    assert c["pruned"] > 0 and c["tokens_total"] < batched["methods"]["confidence"]["tokens_total"]
    assert c["tokens_total"] < base["tokens_total"] == batched["methods"]["no_prune"]["tokens_total"]
    # the first 3 prompts alone: each prompt's beams decide alone, so their tokens are the
    # first 3 prompts' share of the whole run's
    first = evaluate(beam_cfg(trained, "search.beam_width=2", "search.beam_checks=null",
                              "search.refill=true", "evaluate.methods=[confidence]",
                              "evaluate.text_metrics=false", "evaluate.max_prompts=3"))
    assert first["protocol"]["prompts"] == 3 < batched["protocol"]["prompts"]
    assert 0 < first["methods"]["no_prune"]["tokens_total"] < base["tokens_total"]
    # pruned against plain beam search on the same prompts: a paired difference
    d = batched["methods"]["confidence"]["accuracy_vs_no_prune"]
    assert d["prompts"] == batched["protocol"]["prompts"] and d["ci"][0] <= d["diff"] <= d["ci"][1]
    assert d["diff"] == pytest.approx(batched["methods"]["confidence"]["accuracy"]
                                      - batched["methods"]["no_prune"]["accuracy"], abs=1e-12)
    assert "accuracy_vs_no_prune" not in batched["methods"]["no_prune"]
    assert "accuracy - no_prune, paired 95% CI" in print_table(batched)

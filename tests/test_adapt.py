"""Online fine-tuning from pruning feedback (stopexp/stages/adapt.py), replayed on the small bank."""
import copy
import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from conftest import FP32_REORDER, compose
from stopexp.config import ConfigError, checkpoint_tokens, validate
from stopexp.evaluation.accounting import replay_paths
from stopexp.stages import build
from stopexp.stages.shift import target_config, target_overrides
from stopexp.store import bank
from stopexp.training.losses import build_loss
from stopexp.training.stream import (feedback, mc_draws, replay_continuations, replay_decider,
                                     run_stream, stream_order, take)

ADAPT = ["adapt.stream_prompts=4", "adapt.heldout_prompts=2", "adapt.batch_prompts=2",
         "adapt.steps=3", "adapt.lr=0.003", "adapt.buffer=1", "adapt.explore=0.5", "policy.keep=4",
         "train.epochs=3"]


def _setup(small_bank, *extra):
    from stopexp.signals.checkpoint import load_predictor
    from stopexp.store.features import require_features, spec_of
    from stopexp.stages.build import predictor_dir
    from stopexp.stages.train import train

    cfg = validate(compose("adapt", [*small_bank, *ADAPT, *extra]))
    train(cfg, progress=False)
    root = bank.require_bank(build.bank(cfg))
    meta = bank.read_meta(root)
    predictor, _ = load_predictor(predictor_dir(cfg, build.features(cfg)), spec_of(cfg.tap.layers, meta), cfg.predictor)
    ckpt = checkpoint_tokens(cfg.search.check_at, cfg.search.max_new_tokens)
    paths = replay_paths(root, require_features(build.features(cfg)), "test", ckpt)
    order, held = stream_order(int(paths.group.max()) + 1, 4, 2, cfg.adapt.seed)
    return cfg, predictor, paths, order, take(paths, held), ckpt


def _run(cfg, predictor, paths, order, heldout, ckpt, variant, decide=None, continue_=None):
    p = copy.deepcopy(predictor) if predictor is not None else None
    return run_stream(p, decide or replay_decider(paths, cfg.policy, cfg.search.n_paths), order,
                      heldout, cfg.adapt, build_loss(cfg.loss), variant=variant,
                      n_paths=cfg.search.n_paths, checkpoint=ckpt, seconds_per_token=1e-3,
                      continue_=continue_ or replay_continuations(cfg.adapt.mc_rollouts)), p


def test_a_seeded_stream_pins_its_first_updates(small_bank):
    cfg, predictor, paths, order, heldout, ckpt = _setup(small_bank)
    assert order.tolist() == ORDER
    recs, p = _run(cfg, predictor, paths, order, heldout, ckpt, "explore")
    got = [(r["loss_first"], r["loss_last"], r["explored_paths"], r["feedback_paths"]) for r in recs]
    for (lf, ll, ex, fb), (plf, pll, pex, pfb) in zip(got, PINNED_EXPLORE):
        assert lf == pytest.approx(plf, abs=1e-5) and ll == pytest.approx(pll, abs=1e-5)
        assert (ex, fb) == (pex, pfb)
    # AdamW moves a coordinate by ~lr * sign(gradient) whatever its size, so a pinned weight
    # holds across CPUs only where the gradient stands far above rounding noise: on these four
    # coordinates every step's |gradient| is >= 9e-5, against float32 noise of ~1e-10 on it
    weight = next(v for k, v in p.state_dict().items() if v.dim() == 2)
    assert float(weight[0, :4].sum()) == pytest.approx(PINNED_WEIGHT, abs=1e-5)
    again, _ = _run(cfg, predictor, paths, order, heldout, ckpt, "explore")
    untimed = [[(k, v) for k, v in r.items() if not k.endswith("_s")] for r in (*recs, *again)]
    assert untimed[:2] == untimed[2:]  # the same seed, the same stream, draws and updates
    kept, _ = _run(cfg, predictor, paths, order, heldout, ckpt, "kept_only")
    assert [r["explored_paths"] for r in kept] == [0, 0]
    assert [r["loss_first"] for r in kept] == pytest.approx([PINNED_KEPT_FIRST] * 2, abs=1e-5)
    assert [r["loss_last"] for r in kept] == pytest.approx([PINNED_KEPT_FIRST] * 2, abs=1e-5)


def test_frozen_never_changes_and_full_exploration_costs_what_no_prune_does(small_bank):
    cfg, predictor, paths, order, heldout, ckpt = _setup(small_bank)
    frozen, p = _run(cfg, predictor, paths, order, heldout, ckpt, "frozen")
    assert all(a.equal(b) for a, b in zip(p.state_dict().values(), predictor.state_dict().values()))
    assert all(math.isnan(r["loss_first"]) and r["update_s"] == 0 for r in frozen)
    assert frozen[0]["heldout_auroc"] == frozen[1]["heldout_auroc"]
    full = validate(compose("adapt", [*small_bank, *ADAPT, "adapt.explore=1"]))
    explore_all, _ = _run(full, predictor, paths, order, heldout, ckpt, "explore")
    no_prune, _ = _run(full, None, paths, order, heldout, ckpt, "no_prune")
    assert [r["tokens"] for r in explore_all] == [r["tokens"] for r in no_prune]
    assert [r["accuracy"] for r in explore_all] == [r["accuracy"] for r in no_prune]
    pruned = [r["tokens"] for r in frozen]
    assert all(x < y for x, y in zip(pruned, (r["tokens"] for r in no_prune)))
    assert sum(r["explore_tokens"] for r in explore_all) == pytest.approx(
        sum(r["tokens"] for r in no_prune) - sum(pruned))


def test_weighted_losses_reduce_to_the_unweighted_ones_and_weight_pairs_by_products():
    scores = torch.tensor([2.0, 0.5, -1.0, 0.0])
    batch = {"correct": torch.tensor([1.0, 0.0, 1.0, 0.0]), "group": torch.tensor([0, 0, 0, 1]),
             "mc": torch.full((4,), float("nan")), "remaining": torch.zeros(4),
             "prefix_len": torch.arange(4.0)}
    for name in ("contrastive", "pairwise", "reward_regression", "mse"):
        loss = build_loss(OmegaConf.create({"name": name, "margin": 1.0, "discount": 0.95,
                                            "length_reg": 0.0}))
        ones = {**batch, "weight": torch.ones(4)}
        assert float(loss(scores, ones)) == pytest.approx(float(loss(scores, batch)), abs=1e-7)
    contrastive = build_loss(OmegaConf.create({"name": "contrastive", "margin": 1.0,
                                               "discount": 0.95, "length_reg": 0.0}))
    # pairs (0,1): relu(1 - 1.5) = 0, weight 1*2; (2,1): relu(1 + 1.5) = 2.5, weight 3*2
    weighted = {**batch, "weight": torch.tensor([1.0, 2.0, 3.0, 1.0])}
    assert float(contrastive(scores, weighted)) == pytest.approx(2.5 * 6 / 8)


def test_the_target_config_shifts_the_lm_or_pins_it():
    from stopexp.models.toy_lm import toy_key

    cfg = validate(compose("adapt", ["+exp=toy_shift"]))
    tgt = target_config(cfg)
    assert toy_key(cfg.model.toy, cfg.task) == "27c2bc494cd4" != toy_key(tgt.model.toy, tgt.task)
    assert OmegaConf.to_container(tgt.task.styles) == {"careful": 0.8, "shortcut": 0.2}
    assert tgt.model.toy.seed == 1 and cfg.model.toy.seed == 0 and not tgt.adapt.target
    assert tgt.collect.mc_rollouts == 4 and cfg.collect.mc_rollouts == 0  # MC labels: target only
    assert target_overrides(cfg, ["+exp=toy_shift", "adapt.lr=0.1"]) == [
        "+exp=toy_shift", '"task.styles={careful:0.8,shortcut:0.2}"', '"model.toy.seed=1"',
        '"collect.mc_rollouts=4"']
    # a prompt shift with the LM pinned: the same LM, another bank
    pinned = compose("adapt", ["++adapt.target={task.n_steps:8}"])
    tgt = target_config(validate(pinned))
    assert tgt.task.n_steps == 8 and OmegaConf.to_container(tgt.model.toy.train_task) == {"n_steps": 6}
    assert toy_key(tgt.model.toy, tgt.task) == toy_key(pinned.model.toy, pinned.task) == "27c2bc494cd4"
    assert build.bank(tgt).key != build.bank(pinned).key
    assert target_overrides(pinned, []) == ['"task.n_steps=8"', '"+model.toy.train_task.n_steps=6"']


@pytest.mark.parametrize("override,match", [
    ("++adapt.target={task.n_step:8}", r"adapt.target: \['task.n_step'\] are not config keys"),
    ("++adapt.target={adapt.lr:1}", r"adapt.target: \['adapt.lr'\] are not config keys"),
    ("++adapt.target={task.multipliers:[2]}", r"adapt.target: task.multipliers: \[2\]"),
    ("adapt.lr=nan", r"adapt.lr: nan is not a finite number"),
    ("adapt.explore=0", r"adapt.explore: the explore variant needs a share"),
    ("adapt.explore=1.5", r"adapt.explore: must lie in \[0, 1\]"),
    ("adapt.stream_prompts=190", r"adapt.stream_prompts: 190 streamed \+ 50 held out"),
    ("adapt.variants=[frozen,online]", r"adapt.variants: \['online'\]"),
    ("adapt.batch_prompts=0", r"adapt.batch_prompts: must be >= 1"),
])
def test_bad_adapt_values_fail_before_compute(override, match):
    with pytest.raises(ConfigError, match=match):
        validate(compose("adapt", [override]))


def test_the_target_bank_may_hold_more_prompts_than_the_source():
    cfg = validate(compose("adapt", ["adapt.stream_prompts=300", "++adapt.target={collect.prompts.test:400}"]))
    assert (target_config(cfg).collect.prompts.test, cfg.collect.prompts.test) == (400, 200)
    assert build.bank(target_config(cfg)).key != build.bank(cfg).key
    with pytest.raises(ConfigError, match=r"300 streamed \+ 50 held out \(adapt.heldout_prompts\) "
                                          r"exceed the 200 test prompts of the target bank"):
        validate(compose("adapt", ["adapt.stream_prompts=300"]))


ORDER = [3, 2, 5, 4]
# (first and last loss of the update, explored paths, feedback paths incl. the buffer)
PINNED_EXPLORE = [(0.5027374625205994, 0.6733444333076477, 5, 13),
                  (0.37588372826576233, 0.4205649793148041, 4, 25)]
PINNED_WEIGHT = -0.11275222152471542
# kept-only feedback here pairs only paths with the same 5-token prefix (loss 1, no gradient)
# or already well-separated ones (loss 0): the self-confirming sample exploration breaks
PINNED_KEPT_FIRST = 0.5


@pytest.mark.parametrize("exp", ["toy_shift", "toy_contrastive", "toy_reward", "llama_contrastive",
                                 "smollm2_shift"])
def test_experiments_validate_for_adapt(exp):
    assert validate(compose("adapt", [f"+exp={exp}"])).stage == "adapt"


@pytest.mark.parametrize("override,match", [
    ("+model.toy.train_task.n_step=6", r"model.toy.train_task: \['n_step'\] are not arith task keys"),
    ("+model.toy.train_task.multipliers=[2]", r"model.toy.train_task: task.multipliers: \[2\]"),
])
def test_a_bad_pinned_lm_task_fails_before_training_an_lm(override, match):
    with pytest.raises(ConfigError, match=match):
        validate(compose("collect", [override]))


def test_beam_search_is_refused_by_adapt():
    with pytest.raises(ConfigError, match=r"search.name: adapt prunes with Launch-Check-Resume"):
        validate(compose("adapt", ["+exp=toy_beam"]))


def test_a_missing_target_bank_names_the_collect_command(small_bank):
    from stopexp.stages.adapt import adapt

    cfg = validate(compose("adapt", [*small_bank, *ADAPT, "++adapt.target={task.n_steps:5}"]))
    with pytest.raises(bank.BankMissing, match=r"python -m stopexp.collect .*\"task.n_steps=5\" "
                                              r"\"\+model.toy.train_task.n_steps=6\""):
        adapt(cfg, overrides=[*small_bank, "++adapt.target={task.n_steps:5}"])


def test_the_stage_writes_curves_plots_and_a_summary(small_bank, tmp_path):
    from stopexp.evaluation.learning_curves import summarize_variants, variants_table
    from stopexp.stages.adapt import adapt

    cfg = validate(compose("adapt", [*small_bank, *ADAPT, *MC]))
    m = adapt(cfg, overrides=small_bank, run_dir=tmp_path)
    assert list(m["variants"]) == ["no_prune", "frozen", "kept_only", "explore", "mc_feedback",
                                   "retrained"]
    assert all(len(c) == 2 for c in m["curves"].values())
    assert m["variants"]["no_prune"]["tokens_ratio"] == 1.0
    assert m["variants"]["frozen"]["tokens_ratio"] < 1.0
    mc = m["variants"]["mc_feedback"]
    assert mc["mc_tokens"] == sum(r["mc_tokens"] for r in m["curves"]["mc_feedback"]) > 0
    assert m["variants"]["kept_only"]["mc_tokens"] == 0
    curves = copy.deepcopy(m["curves"])  # no shift here: give the ceiling a gap to close
    curves["retrained"][-1]["heldout_auroc"] = m["variants"]["frozen"]["heldout_auroc"] + 0.1
    assert set(summarize_variants(curves)["mc_feedback"]) >= {"gap_closed", "prompts_to_half_gap"}
    assert (tmp_path / "learning_curves.png").stat().st_size > 0
    table = variants_table(m)
    assert "explore" in table and "mc_feedback" in table and "MC tok" in table
    held = m["heldout_auroc_per_prompt"]["frozen"]
    assert np.nanmean(held) == pytest.approx(m["variants"]["frozen"]["heldout_auroc"], abs=1e-12)
    assert m["variants"]["explore"]["heldout_vs_frozen"]["prompts"] == np.isfinite(held).sum() > 0
    assert "explore: held-out AUROC - frozen" in table


def test_the_gap_closed_has_a_paired_interval_over_the_held_out_prompts():
    """Prompt 0 closes half of its gap, prompt 1 0.8 of it, prompts 2 and 3 lack a value
    for one variant: the gap closed over both is 0.25 / 0.35, its resamples lie in
    [0.5, 0.8] and a quarter of them draw one prompt twice."""
    from stopexp.evaluation.learning_curves import add_gap_intervals

    nan = float("nan")
    per_prompt = {"frozen": np.array([0.5, 0.5, nan, 0.4]),
                  "retrained": np.array([0.7, 1.0, 0.6, 0.6]),
                  "explore": np.array([0.6, 0.9, 0.5, nan])}
    out = {"frozen": {}, "retrained": {}, "explore": {"gap_closed": 0.25 / 0.35}}
    add_gap_intervals(out, per_prompt, n_boot=1000, seed=0)
    assert out["explore"]["gap_closed_ci"] == pytest.approx([0.5, 0.8], abs=1e-12)
    assert out["explore"]["gap_closed_nan_resamples"] == 0
    d = out["explore"]["heldout_vs_frozen"]
    assert (d["diff"], d["prompts"], d["excluded"]) == (pytest.approx(0.25, abs=1e-12), 2, 2)
    assert "gap_closed_ci" not in out["retrained"] and out["frozen"] == {}
    gap = out["retrained"]["heldout_vs_frozen"]  # +0.2 and +0.5 on prompts 0, 1; +0.2 on 3
    assert (gap["diff"], gap["ci"]) == (pytest.approx(0.3, abs=1e-12), pytest.approx([0.2, 0.5], abs=1e-12))
    without = {"frozen": {}, "retrained": {}, "explore": {}}  # no gap_closed: no interval of it
    add_gap_intervals(without, per_prompt, n_boot=1000, seed=0)
    assert "gap_closed_ci" not in without["explore"] and "heldout_vs_frozen" in without["explore"]


@pytest.mark.parametrize("ceiling", [[0.7, 1.0, 0.6, 0.6], [0.45, 0.55, 0.6, 0.4]])
def test_a_gap_closed_is_kept_only_where_retrained_is_above_frozen(ceiling):
    """Held-out AUROCs per prompt: retrained above frozen on the three prompts both rank
    (+0.2, +0.5, +0.2: interval [0.2, 0.5]) keeps explore's gap closed and its interval;
    -0.05, +0.05, 0 (interval spanning 0) leaves no gap: no share, no interval, `no_gap`."""
    from stopexp.evaluation.learning_curves import summarize_variants

    def curve(auroc):
        return [{"prompts_seen": 10, "accuracy": 0.5, "tokens": 100.0, "explore_tokens": 0.0,
                 "wall_s": 1.0, "update_s": 0.0, "auroc": 0.6, "heldout_auroc": auroc}]

    nan = float("nan")
    per_prompt = {"frozen": [0.5, 0.5, nan, 0.4], "retrained": ceiling, "explore": [0.6, 0.9, 0.5, nan]}
    mean = {v: float(np.nanmean(x)) for v, x in per_prompt.items()}
    out = summarize_variants({v: curve(m) for v, m in mean.items()}, held_aurocs=per_prompt)
    kept = ceiling[0] > 0.5
    assert ("gap_closed" in out["explore"]) == ("gap_closed_ci" in out["explore"]) == kept
    assert ("prompts_to_half_gap" in out["explore"]) == kept
    assert out["explore"].get("no_gap", False) == (not kept)
    assert "heldout_vs_frozen" in out["explore"]  # the paired difference stays


def test_the_tracker_gets_the_intervals_as_scalars():
    from stopexp.evaluation.learning_curves import flat_summary

    s = {"accuracy": 0.5, "prompts_to_half_gap": None, "gap_closed_ci": [0.2, 0.9],
         "heldout_vs_frozen": {"diff": 0.1, "ci": [0.0, 0.2], "prompts": 7, "excluded": 1}}
    assert flat_summary(s) == {"accuracy": 0.5, "heldout_vs_frozen": 0.1, "heldout_vs_frozen_lo": 0.0,
                               "heldout_vs_frozen_hi": 0.2, "heldout_vs_frozen_prompts": 7,
                               "gap_closed_lo": 0.2, "gap_closed_hi": 0.9}


@pytest.mark.parametrize("ceiling_ci,line", [
    ([0.2, 0.5], "explore: held-out AUROC - frozen +0.250 [+0.100, +0.400] (95%, paired over 2 "
                 "prompts); gap closed 0.71 [0.50, 0.80]"),
    ([-0.1, 0.5], "explore: held-out AUROC - frozen +0.250 [+0.100, +0.400] (95%, paired over 2 "
                  "prompts); no gap to close: retrained - frozen is not above 0"),
    ([-0.5, -0.1], "explore: held-out AUROC - frozen +0.250 [+0.100, +0.400] (95%, paired over 2 "
                   "prompts); no gap to close: retrained - frozen is not above 0"),
])
def test_the_table_shows_the_gap_closed_only_when_there_is_a_gap(ceiling_ci, line):
    from stopexp.evaluation.learning_curves import variants_table

    row = {"accuracy": 0.5, "tokens_total": 10.0, "explore_tokens": 0.0, "auroc_last": 0.6,
           "heldout_auroc": 0.6, "update_s": 0.0, "wall_s": 1.0}
    paired = {"diff": 0.25, "ci": [0.1, 0.4], "prompts": 2, "excluded": 0}
    metrics = {"protocol": {"stream_prompts": 4, "batch_prompts": 2, "n": 8, "k": 4,
                            "check_tokens": 28},
               "target": {"task.steps": [3, 4]},
               "variants": {"frozen": row,
                            "retrained": {**row, "heldout_vs_frozen": {**paired, "ci": ceiling_ci}},
                            "explore": {**row, "gap_closed": 0.25 / 0.35, "heldout_vs_frozen": paired,
                                        "gap_closed_ci": [0.5, 0.8]}}}
    # the decision of summarize_variants, on the same held-out AUROCs
    if not ceiling_ci[0] > 0:
        explore = metrics["variants"]["explore"]
        for k in ("gap_closed", "gap_closed_ci"):
            explore.pop(k)
        explore["no_gap"] = True
    table = variants_table(metrics).splitlines()
    assert table[-1] == line
    assert table[4].split()[-3] == ("0.71" if ceiling_ci[0] > 0 else "-")  # the explore row's column


def _with_bank_features(decide, paths):
    """The online decider, its check features swapped for the replay's after checking that
    they agree. Decode-time taps and the teacher-forced forward of featurize sum in other
    orders, so the two differ by float32 rounding (~1e-6, bounded by tests/test_features.py);
    Adam's per-coordinate normalisation lifts such noise on near-zero gradients to a share of
    lr per step, so trained weights from the two feature sources differ by a machine-dependent
    amount. With the same features every step after the decisions is the same arithmetic on
    the same tensors, so weights and records must be equal, not close."""
    from stopexp.training.stream import predictor_scores

    def wrapped(groups, predictor, epsilon, rng):
        view, scores, kept, explored, wall = decide(groups, predictor, epsilon, rng)
        ref = take(paths, groups)
        assert (view.alive == ref.alive).all() and (view.length == ref.length).all()
        live = torch.as_tensor(view.alive)
        for key in ("hidden", "signals"):
            torch.testing.assert_close(view.batch[key][live], ref.batch[key][live], **FP32_REORDER)
            view.batch[key] = ref.batch[key]
        if scores is not None:
            scores = predictor_scores(predictor, view.batch)
        return view, scores, kept, explored, wall

    return wrapped


def test_replay_equals_online(small_bank):
    from stopexp.training.online import online_decider, prompt_ids_of

    cfg, predictor, paths, order, heldout, ckpt = _setup(small_bank, *MC)
    lm = build.online_lm(cfg, cfg.adapt.split, int(prompt_ids_of(paths).max()) + 1, progress=False)
    online, continue_ = online_decider(lm, paths, ckpt, search=cfg.search, tap=cfg.tap,
                                       policy=cfg.policy, seed=cfg.seed,
                                       mc_rollouts=cfg.adapt.mc_rollouts)
    online = _with_bank_features(online, paths)
    for variant in ("no_prune", "explore", "mc_feedback"):
        replay, p_replay = _run(cfg, predictor, paths, order, heldout, ckpt, variant)
        live, p_live = _run(cfg, predictor, paths, order, heldout, ckpt, variant, online, continue_)
        for r, o in zip(replay, live):
            timed = {"tokens", "mc_tokens", "wall_estimated"}  # replay estimates these, online measures
            same = [k for k in r if not k.endswith("_s") and k not in timed]
            assert {k: o[k] for k in same} == pytest.approx({k: r[k] for k in same}, abs=0, rel=0,
                                                           nan_ok=True), variant
            # Monte Carlo tokens: replay estimates them (K x the path's remaining), online counts
            assert o["tokens"] - o["mc_tokens"] == r["tokens"] - r["mc_tokens"]
            assert (o["mc_tokens"] > 0) == (r["mc_tokens"] > 0) == (variant == "mc_feedback")
            assert not o["wall_estimated"] and o["wall_s"] > 0
        if p_replay is not None:
            for a, b in zip(p_replay.state_dict().values(), p_live.state_dict().values()):
                assert torch.equal(a, b)
        if variant == "explore":
            assert sum(r["explored_paths"] for r in replay) > 0
        if variant == "mc_feedback":  # the same prefixes, rollouts and rates in both modes
            assert sum(r["mc_paths"] for r in replay) == 6 and replay[1]["mc_rate"] == 0.5


MC = ["adapt.variants=[no_prune,frozen,kept_only,explore,mc_feedback,retrained]",
      "adapt.mc_rollouts=2", "adapt.mc_prefixes=3"]  # the small bank: collect.mc_rollouts=2


def test_mc_feedback_labels_pruned_prefixes_by_the_banks_rate_and_counts_their_tokens(small_bank):
    cfg, predictor, paths, order, heldout, ckpt = _setup(small_bank, *MC)
    recs, _ = _run(cfg, predictor, paths, order, heldout, ckpt, "mc_feedback")
    kept, _ = _run(cfg, predictor, paths, order, heldout, ckpt, "kept_only")
    assert [r["mc_paths"] for r in recs] == [3, 3] and [r["explored_paths"] for r in recs] == [0, 0]
    # the same source predictor prunes the first batch alike: the rollouts are the extra cost
    assert recs[0]["tokens"] == kept[0]["tokens"] + recs[0]["mc_tokens"]
    assert recs[0]["kept_paths"] == kept[0]["kept_paths"]
    assert recs[0]["feedback_paths"] == kept[0]["feedback_paths"] + 3
    got = [(r["loss_first"], r["loss_last"], r["mc_tokens"], r["mc_rate"]) for r in recs]
    for g, want in zip(got, PINNED_MC):
        assert g == pytest.approx(want, abs=1e-5)
    # the draws and the feedback batch of the first batch, by hand
    view, scores, kept_rows, explored, _ = replay_decider(paths, cfg.policy, cfg.search.n_paths)(
        order[:2], predictor, 0.0, None)
    rows, chance = mc_draws(view, kept_rows, explored, 3, np.random.default_rng(cfg.adapt.seed), 8)
    pruned = view.alive & (view.path_id < 8) & ~kept_rows
    assert chance == pytest.approx(3 / pruned.sum()) and pruned[rows].all() and len(rows) == 3
    rate, tokens, _ = replay_continuations(cfg.adapt.mc_rollouts)(view, rows)
    assert rate.tolist() == view.batch["mc"][torch.as_tensor(rows)].tolist()
    assert tokens.tolist() == (2 * (view.length[rows] - ckpt)).tolist()
    weight = np.ones(len(kept_rows))
    weight[rows] = 1 / chance
    fb = feedback(view, kept_rows, weight, 0, {"rows": rows, "rate": rate, "tokens": tokens,
                                               "rollouts": 2})
    soft = ~torch.isnan(fb["mc"])
    assert int(soft.sum()) == 3 and sorted(fb["mc"][soft].tolist()) == sorted(rate.tolist())
    assert fb["correct"][soft].tolist() == fb["mc"][soft].tolist()  # the rate is the label
    assert fb["weight"][soft].tolist() == pytest.approx([float(pruned.sum()) / 3] * 3)
    assert fb["weight"][~soft].tolist() == [1.0] * int((~soft).sum())
    assert set(fb["correct"][~soft].tolist()) <= {0.0, 1.0}  # kept paths: their outcome


def test_mc_feedback_in_replay_refuses_a_bank_without_monte_carlo_labels(small_bank):
    cfg, predictor, paths, order, heldout, ckpt = _setup(small_bank, *MC)
    paths.batch["mc"] = torch.full_like(paths.batch["mc"], float("nan"))
    with pytest.raises(ValueError, match=r"no Monte Carlo label at the check.*collect.mc_rollouts=2"):
        _run(cfg, predictor, paths, order, heldout, ckpt, "mc_feedback")


@pytest.mark.parametrize("overrides,match", [
    (["adapt.variants=[frozen,mc_feedback]"],
     r"adapt.mc_rollouts: mc_feedback replays 4 continuations .* collect.mc_rollouts=0"),
    (["adapt.variants=[frozen,mc_feedback]", "++adapt.target={collect.mc_rollouts:2}"],
     r"adapt.mc_rollouts: .* collect.mc_rollouts=2; give the target collect.mc_rollouts: 4"),
    (["adapt.variants=[mc_feedback]", "adapt.mc_prefixes=0"], r"adapt.mc_prefixes: must be >= 1"),
    (["adapt.variants=[mc_feedback]", "evaluate.mode=online", "adapt.mc_rollouts=0"],
     r"adapt.mc_rollouts: must be >= 1"),
    (["adapt.mc_prefixes=-1"], r"adapt.mc_prefixes: must be >= 0"),
    (["++adapt.target={collect.seed:1}"], r"adapt.target: \['collect.seed'\] are not config keys"),
])
def test_bad_mc_feedback_values_fail_before_compute(overrides, match):
    with pytest.raises(ConfigError, match=match):
        validate(compose("adapt", overrides))


def test_mc_feedback_validates_with_monte_carlo_labels_in_the_target_only():
    cfg = validate(compose("adapt", ["+exp=toy_shift", "adapt.variants=[frozen,mc_feedback]",
                                     "++adapt.target={model.toy.seed:1,collect.mc_rollouts:4}"]))
    assert cfg.collect.mc_rollouts == 0 and target_config(cfg).collect.mc_rollouts == 4
    # the command line's target replaces toy_shift's (its task.styles is gone)
    assert target_overrides(cfg, ["+exp=toy_shift", "++adapt.target={model.toy.seed:1,collect.mc_rollouts:4}",
                                  "~adapt.seed"]) == [
        "+exp=toy_shift", '"model.toy.seed=1"', '"collect.mc_rollouts=4"']
    online = validate(compose("adapt", ["adapt.variants=[mc_feedback]", "evaluate.mode=online"]))
    assert online.adapt.mc_rollouts == 4  # online forks the LM: no bank labels needed


def test_contrastive_pairs_follow_soft_labels():
    scores = torch.tensor([0.0, 0.5, 2.0])
    batch = {"correct": torch.tensor([0.75, 0.25, 1.0]), "group": torch.zeros(3, dtype=torch.long)}
    loss = build_loss(OmegaConf.create({"name": "contrastive", "margin": 1.0, "discount": 0.95,
                                        "length_reg": 0.0}))
    # pairs (0 over 1): relu(1 + 0.5) = 1.5; (2 over 0): relu(1 - 2) = 0; (2 over 1): relu(1 - 1.5) = 0
    assert float(loss(scores, batch)) == pytest.approx(1.5 / 3)


# (first and last loss of the update, Monte Carlo tokens (2 x remaining), mean success rate)
PINNED_MC = [(0.10000000149011612, 0.09999999403953552, 132.0, 0.0),
             (0.18807339668273926, 0.18807339668273926, 156.0, 0.5)]

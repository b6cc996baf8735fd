"""Online fine-tuning from pruning feedback (stopexp/stages/adapt.py) replayed on the small
bank: a seeded stream's pinned updates, the variants' costs, Monte Carlo feedback, the
weighted and soft-label losses, replay equal to the online run, and the stage's outputs.
The tests share one trained source predictor (`_setup`), trained once per worker."""
import copy
import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from conftest import FP32_REORDER, compose
from stopexp.config import checkpoint_tokens, validate
from stopexp.evaluation.accounting import replay_paths
from stopexp.stages import build
from stopexp.store import bank
from stopexp.training.losses import build_loss
from stopexp.training.stream import (feedback, mc_draws, replay_continuations, replay_decider,
                                     run_stream, stream_order, take)


ADAPT = ["adapt.stream_prompts=4", "adapt.heldout_prompts=2", "adapt.batch_prompts=2",
         "adapt.steps=3", "adapt.lr=0.003", "adapt.buffer=1", "adapt.explore=0.5", "policy.keep=4",
         "train.epochs=3"]


MC = ["adapt.variants=[no_prune,frozen,kept_only,explore,mc_feedback,retrained]",
      "adapt.mc_rollouts=2", "adapt.mc_prefixes=3"]  # the small bank: collect.mc_rollouts=2


def _setup(small_bank, *extra):
    from stopexp.signals.saved_predictor import load_predictor
    from stopexp.store.feature_sets import require_features, spec_of
    from stopexp.stages.build import predictor_dir
    from stopexp.stages.train import train_with_controls

    cfg = validate(compose("adapt", [*small_bank, *ADAPT, *extra]))
    train_with_controls(cfg, progress=False)
    root = bank.require_bank(build.bank(cfg))
    meta = bank.read_meta(root)
    predictor, _ = load_predictor(predictor_dir(cfg, build.feature_set(cfg)), spec_of(cfg.tap.layers, meta), cfg.predictor)
    ckpt = checkpoint_tokens(cfg.search.check_at, cfg.search.max_new_tokens)
    paths = replay_paths(root, require_features(build.feature_set(cfg)), "test", ckpt)
    order, held = stream_order(int(paths.group.max()) + 1, 4, 2, cfg.adapt.seed)
    return cfg, predictor, paths, order, take(paths, held), ckpt


def _run(cfg, predictor, paths, order, heldout, ckpt, variant, decide=None, continue_=None):
    p = copy.deepcopy(predictor) if predictor is not None else None
    return run_stream(p, decide or replay_decider(paths, cfg.policy, cfg.search.n_paths), order,
                      heldout, cfg.adapt, build_loss(cfg.loss), variant=variant,
                      n_paths=cfg.search.n_paths, checkpoint=ckpt, seconds_per_token=1e-3,
                      continue_=continue_ or replay_continuations(cfg.adapt.mc_rollouts)), p


ORDER = [3, 2, 5, 4]


# (first and last loss of the update, explored paths, feedback paths incl. the buffer)
PINNED_EXPLORE = [(0.5027374625205994, 0.6733444333076477, 5, 13),
                  (0.37588372826576233, 0.4205649793148041, 4, 25)]


PINNED_WEIGHT = -0.11275222152471542


# kept-only feedback here pairs only paths with the same 5-token prefix (loss 1, no gradient)
# or already well-separated ones (loss 0): the self-confirming sample exploration breaks
PINNED_KEPT_FIRST = 0.5


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
    from stopexp.training.online_lm import online_decider, prompt_ids_of

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


def test_a_missing_target_bank_names_the_collect_command(small_bank):
    from stopexp.stages.adapt import adapt

    cfg = validate(compose("adapt", [*small_bank, *ADAPT, "++adapt.target={task.n_steps:5}"]))
    with pytest.raises(bank.BankMissing, match=r"python -m stopexp.collect .* task.n_steps=5 "
                                              r"\+model.toy.train_task.n_steps=6 "):
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

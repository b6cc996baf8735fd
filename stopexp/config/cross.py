"""Rules spanning config groups: one option that forbids or requires another. A group's
module checks its own keys, with bounds taken from other groups (N = search.n_paths,
search.max_new_tokens, the task's splits); a rule is here when it ties choices of different
groups together. Each rule is named for what it holds and takes the whole config; none
asks which stage runs: stopexp.config.validation.RULES lists each with the stages that
need it, and validate applies those of cfg.stage. adapt's own rules on the other groups
(search=parallel, no super_token, evaluate's selection unused) are adapt's:
stopexp.config.adapt.
"""
from __future__ import annotations

from omegaconf import OmegaConf

from stopexp.config.predictor import PREDICTOR
from stopexp.config.ranges import fail, is_list, n_layers_of
from stopexp.config.task import step_separator_of, task_sections
from stopexp.config.thinking import thinks
from stopexp.core.names import BOUNDED_REWARDS, lookup, names, runs_the_lm
from stopexp.core.protocol import check_values, checkpoint_tokens, checkpoints_of, resolve_layers
from stopexp.core.config_text import decode_escapes, stop_strings


def fewshot_is_plain_text(cfg) -> None:
    m = cfg.model
    for key, t in task_sections(cfg.task):  # a mixture's components share the chat template
        if "fewshot" in lookup("task", t.name).formats and t.get("format", "fewshot") == "fewshot" \
                and m.chat_template and m.name != "toy":
            fail("model.chat_template", f"{key}.format=fewshot is plain text after solved "
                                        f"examples; set model.chat_template=false (or "
                                        f"{key}.format=chat)")


def step_ends_need_a_separator(cfg) -> None:
    """tap.positions.step_ends needs a task with a step separator (its class's
    `step_separator`, stopexp.tasks.task.Task) that is not itself a stop string: a path ends
    at a stop string, so no step of it would end before the path does."""
    if not cfg.tap.positions.step_ends:
        return
    name = cfg.task.name
    # a thinking model's reasoning steps end at its own separator (model.thinking.step_separator)
    sep = decode_escapes(cfg.model.thinking.step_separator) if thinks(cfg.model) else \
        step_separator_of(cfg.task)
    if not sep:
        with_steps = [n for n in names("task") if lookup("task", n).step_separator]
        fail("tap.positions.step_ends", f"task {name} has no step separator (a path is one "
                                        f"sentence); allowed with tasks {', '.join(with_steps)}, "
                                        "else use tap.positions.stride or tap.positions.checkpoints")
    stops = [x for x in stop_strings(cfg.task, cfg.search) if x in sep]
    if stops:
        fail("tap.positions.step_ends", f"the step separator {sep!r} of task {name} completes "
                                        f"the stop string {stops[0]!r} (task.stop / search.stop), "
                                        "so a path ends at its first step end and none would be "
                                        "stored; drop that stop string or use tap.positions.stride")


def checks_are_tapped(cfg) -> None:
    """search.check_at (increasing) and train.checkpoint are positions the features hold:
    tap.checkpoints, tap.positions.checkpoints or a multiple of tap.positions.stride (replay
    and training read them there; online checks tap wherever they are asked)."""
    s, tap = cfg.search, cfg.tap
    m = s.max_new_tokens
    listed = checkpoints_of([*tap.checkpoints, *tap.positions.checkpoints], m)
    stride = tap.positions.stride
    held = f"tap.checkpoints {list(tap.checkpoints)}"
    if tap.positions.checkpoints:
        held += f", tap.positions.checkpoints {list(tap.positions.checkpoints)}"
    if stride:
        held += f" or a multiple of tap.positions.stride={stride}"
    checks = check_values(s.check_at)
    if not checks:
        fail("search.check_at", f"give a prefix ({held}) or a non-empty list of them")
    for key, value in [*(("search.check_at", c) for c in checks),
                       ("train.checkpoint", cfg.train.checkpoint)]:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            fail(key, f"{value} is not a position the features hold: {held}")
        tokens = checkpoint_tokens(value, m)
        if tokens not in listed and not (stride and tokens % stride == 0 and 1 <= tokens < m):
            fail(key, f"{value} is not a position the features hold: {held}")
    tokens = [checkpoint_tokens(c, m) for c in checks]
    if any(b <= a for a, b in zip(tokens, tokens[1:])):
        fail("search.check_at", f"checks must be increasing prefixes, got {list(checks)} = "
                                f"{tokens} tokens")


def keep_per_check(cfg) -> None:
    """policy.keep: a whole K, or one decreasing K per check of search.check_at under
    policy=topk; several checks only in evaluate's Launch-Check-Resume (search=parallel)."""
    s = cfg.search
    checks = check_values(s.check_at)
    keep = cfg.policy.keep
    keeps = check_values(keep)
    if not keeps:  # each K is whole: stopexp.config.limits.check_whole
        fail("policy.keep", f"{list(keep)} gives no K; give a whole number K or a list of them "
                            "(one per check of search.check_at)")
    if len(keeps) > 1 and len(keeps) != len(checks) or (len(keeps) == 1 and is_list(keep)
                                                          and len(checks) > 1):
        fail("policy.keep", f"{len(keeps)} values for the {len(checks)} checks of "
                            f"search.check_at {list(checks)}; give one K per check")
    if s.name != "parallel":
        one_check(cfg, f"search={s.name}")
    if cfg.policy.name == "topk" and len(checks) > 1:
        plan = keeps * len(checks) if len(keeps) == 1 else keeps
        if any(b >= a for a, b in zip(plan, plan[1:])):
            fail("policy.keep", f"{keep if len(keeps) == 1 else list(keep)} for the checks "
                                f"{list(checks)} of search.check_at: after keeping K paths a "
                                "check sees at most K, so a later check keeping as many or more "
                                "prunes nothing; give one decreasing K per check (e.g. [16, 8])")


def one_check(cfg, who: str) -> None:
    """One prefix and one K, where `who` (a search, a stage) takes no more."""
    checks = check_values(cfg.search.check_at)
    if len(checks) > 1 or is_list(cfg.policy.keep):
        key = "search.check_at" if len(checks) > 1 else "policy.keep"
        fail(key, "several checks (a list in search.check_at or policy.keep) are a "
                  f"Launch-Check-Resume protocol of evaluate (search=parallel); {who} takes one "
                  "prefix and one K")


def adapt_takes_one_check(cfg) -> None:
    one_check(cfg, "adapt")


def signals_are_tapped(cfg) -> None:
    if "attn_entropy" in list(cfg.predictor.signals) and cfg.tap.attention_heads is None:
        fail("predictor.signals", "attn_entropy needs the attention tap: set tap.attention_heads")


def predictor_layer_is_tapped(cfg) -> None:
    """predictor.layer must be a tapped layer, or -1..-len(tap.layers) counted from the
    deepest tapped one (stopexp.signals.feature_spec.tap_index), as far as the config tells;
    for the stages that load a predictor of one tapped layer (the readers of the key)."""
    if cfg.predictor.name not in PREDICTOR.readers("layer"):
        return
    layer, entries = cfg.predictor.layer, list(cfg.tap.layers)
    n_layers = n_layers_of(cfg.model)
    tapped = (resolve_layers(entries, n_layers) if n_layers is not None
              else entries if all(isinstance(e, int) and e >= 0 for e in entries) else None)
    count = len(tapped) if tapped is not None else len(entries)
    if layer < 0 and -count <= layer:
        return
    if layer >= 0 and (tapped is None or layer in tapped):
        return
    fail("predictor.layer", f"{layer} is not a tapped layer; allowed: "
                            f"{tapped if tapped is not None else entries} (tap.layers) or "
                            f"-1..-{count} counted from the deepest tapped layer")


def positions_fit_the_predictor(cfg) -> None:
    pred, tr = cfg.predictor, cfg.train
    if pred.position_input and tr.positions != "all":
        fail("predictor.position_input", "trained at one checkpoint (train.positions=checkpoint) "
                                         "the position is the same for every path, so the head "
                                         "learns nothing from it; set train.positions=all")
    if tr.positions == "all" and runs_the_lm(pred.name):
        fail("train.positions", f"all needs stored features at every position, but {pred.name} "
                                "re-encodes each prefix with the LM; use train.positions=checkpoint")


def regression_needs_bounded_reward(cfg) -> None:
    r = cfg.reward
    if r.name not in BOUNDED_REWARDS and cfg.loss.name in ("reward_regression", "mse"):
        fail("loss.name", f"{cfg.loss.name} regresses a probability on the reward, which must lie "
                          f"in [0, 1]; reward={r.name} is unbounded: use loss=contrastive or pairwise")


def monte_carlo_labels_are_tapped(cfg) -> None:
    """Collect rolls out at tap.checkpoints only: a predictor trained on the Monte Carlo
    labels at one checkpoint is trained at one of them, not at a stride position, where it
    would silently fall back to the outcomes."""
    loss, train = cfg.loss, cfg.train
    if cfg.collect.mc_rollouts <= 0 or loss.name != "reward_regression" or loss.labels != "mc" \
            or train.positions != "checkpoint":
        return
    m = cfg.search.max_new_tokens
    if checkpoint_tokens(train.checkpoint, m) not in checkpoints_of(cfg.tap.checkpoints, m):
        fail("train.checkpoint", f"{train.checkpoint}: the bank holds Monte Carlo labels "
                                 f"(collect.mc_rollouts={cfg.collect.mc_rollouts}) at tap.checkpoints "
                                 f"{list(cfg.tap.checkpoints)} only; add it to tap.checkpoints, or "
                                 "train on the outcomes with loss.labels=reward")


# the losses whose value is a mean over terms a batch's labels count (stopexp.training.losses.loss_terms)
TERMED_LOSSES = ("contrastive", "pairwise", "reward_regression", "mse")


def accumulation_is_one_batch(cfg) -> None:
    """train.accumulate steps on the gradient of one batch of its batches together, which
    holds where the loss is a mean over terms each batch counts (paths or pairs)."""
    n, loss = cfg.train.accumulate, cfg.loss
    if n == 1:
        return
    if loss.name not in TERMED_LOSSES:
        fail("train.accumulate", f"{n}: loss={loss.name} is not known to be a mean over paths or "
                                 f"pairs, so its accumulated gradient need not be one batch's; allowed "
                                 f"with loss={'|'.join(TERMED_LOSSES)}, or train.accumulate=1")
    if loss.length_reg > 0:
        fail("train.accumulate", f"{n}: loss.length_reg={loss.length_reg} correlates the scores "
                                 "of one batch, which batches accumulated apart do not share; set "
                                 "loss.length_reg=0, or train.accumulate=1")


def online_reward_needs_no_logprobs(cfg) -> None:
    if cfg.reward.name == "neg_perplexity" and cfg.evaluate.mode == "online":
        fail("evaluate.mode", "online paths carry text only; reward=neg_perplexity needs the per-token "
                              "log-probs of the bank: use evaluate.mode=replay")


def min_gap_below_reward_range(cfg) -> None:
    r = cfg.reward
    if r.name in BOUNDED_REWARDS and cfg.loss.min_gap >= 1:
        fail("loss.min_gap", f"{cfg.loss.min_gap} skips every pair: reward={r.name} lies in "
                             "[0, 1], so no reward gap exceeds it; allowed: [0, 1)")


def bank_has_training_prompts(cfg) -> None:
    """train (and pipeline, and adapt, which trains the source and target predictors) fits
    on the train prompts (the first train.max_prompts of them, at most the bank's:
    stopexp.config.limits) and selects the epoch on the val ones."""
    for split in ("train", "val"):
        if not cfg.collect.prompts.get(split, 0) > 0:
            fail(f"collect.prompts.{split}", f"train needs {split} prompts in the trace bank, "
                                             f"got {cfg.collect.prompts.get(split, 0)}")


def attn_entropy_method_is_tapped(cfg) -> None:
    if "attn_entropy" in cfg.evaluate.methods and cfg.tap.attention_heads is None:
        fail("evaluate.methods", "attn_entropy needs the attention tap: set tap.attention_heads "
                                 "(all, or a list of layer:head)")


def error_oracle_reads_values(cfg) -> None:
    """error_oracle reads the bank's first_wrong_value: a task whose problems carry their
    intermediate values, answered without thinking, on replayed paths (the paths of an
    online run and beams carry no such label)."""
    if "error_oracle" not in cfg.evaluate.methods:
        return
    name = cfg.task.name
    has_values = lookup("task", name).wrong_value_end is not None
    if not has_values or thinks(cfg.model):
        why = f"task {name!r} has none" if not has_values else \
            "a thinking model's paths are not read for them"
        with_values = [n for n in names("task") if lookup("task", n).wrong_value_end is not None]
        fail("evaluate.methods", f"error_oracle needs paths whose intermediate values are known "
                                 f"(tasks: {', '.join(with_values)}); {why}")
    if cfg.evaluate.mode == "online" or cfg.search.name == "beam":
        fail("evaluate.methods", "error_oracle reads the trace bank's first_wrong_value, which "
                                 "only replayed paths carry; use evaluate.mode=replay and "
                                 "search=parallel, or drop it")


def beam_has_nothing_to_select(cfg) -> None:
    ev = cfg.evaluate
    if cfg.search.name == "beam" and (ev.select != "vote" or ev.compare_beam):
        key = "evaluate.select" if ev.select != "vote" else "evaluate.compare_beam"
        fail(key, "search=beam outputs one hypothesis per prompt: nothing to select among, and it "
                  "is the beam search to compare with; use search=parallel")


def beam_has_no_vote(cfg) -> None:
    if cfg.search.name == "beam" and cfg.evaluate.vote != "majority":
        fail("evaluate.vote", f"{cfg.evaluate.vote!r}: beam search returns one hypothesis per prompt, "
                              "there is no vote to weight or filter; leave it majority")


def beam_scores_each_step(cfg) -> None:
    s = cfg.search
    if s.name == "beam" and s.score_rule != "last":
        fail("search.score_rule", f"{s.score_rule!r} is for Launch-Check-Resume with several "
                                  "checks; beam search acts on each step's score (search.patience)")


def beam_keep_below_width(cfg) -> None:
    s, pol = cfg.search, cfg.policy
    if s.name == "beam" and pol.name == "topk" and pol.keep >= s.beam_width:
        fail("policy.keep", f"policy=topk keeps K={pol.keep} of at most search.beam_width="
                            f"{s.beam_width} live beams, so beam search would never prune and "
                            "every method would equal no_prune; use policy=quantile (as "
                            "+exp=toy_beam does), policy=fixed or a K below the beam width")


# what engine=vllm cannot serve: it generates paths and stops them (collect, online
# Launch-Check-Resume: stopexp.search.lcr), and continues a path's prefix as a new
# request (collect's Monte Carlo rollouts: stopexp.search.vllm_steps.Stepper.rollouts); writing into
# a path between decode steps needs the hf engine. Beam search is not asked of vLLM: under
# either engine its beams run on stopexp's engine, which has the hidden states of every
# step, with the predictor trained on the configured engine's bank (stopexp.evaluation.beam).
# key -> (is it asked for?, why). adapt's online loop is adapt's rule (stopexp.config.adapt)
VLLM_UNSERVED = {
    # vLLM returns the log-probs of one distribution: the filtered one it samples from, but
    # the confidence column is over the unfiltered one (stopexp.search.decode)
    **{f"search.{k}": (lambda cfg, k=k, off=off: cfg.search.do_sample and cfg.search[k] != off,
                       "the confidence column reads the unfiltered distribution, and vLLM "
                       "returns only the filtered one it samples from")
       for k, off in (("top_p", 1.0), ("top_k", 0))},
    "model.thinking.max_thinking_tokens": (
        lambda cfg: cfg.model.thinking.max_thinking_tokens is not None,
        "budget forcing writes the end tag into a path between two decode steps"),
}


def vllm_serves_it(cfg) -> None:
    """Under engine=vllm nothing is asked that only the hf engine serves (VLLM_UNSERVED)."""
    if cfg.engine.name != "vllm":
        return
    for key, (asked, why) in VLLM_UNSERVED.items():
        if asked(cfg):
            fail(key, f"{OmegaConf.select(cfg, key)!r} is not served by engine=vllm ({why}); "
                      "use engine=hf for it")

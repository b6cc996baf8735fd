import copy

import pytest
import torch

from conftest import FP32_REORDER
from stopexp.core.policies import FixedThreshold, TopK
from stopexp.search.beam import beam_search, beam_search_batch
from stopexp.search.taps import Taps
from stopexp.signals.feature_spec import SIGNAL_NAMES

PROMPTS = ["4+7*3-9?", "1-2?", "9*9*9+1-0?"]


@pytest.fixture(scope="module")
def eos_lm(tiny_lm):
    """The tiny model with sharper logits and an EOS row that dominates in some contexts
    only, so hypotheses finish at many lengths and the early-stop rule triggers."""
    model, tok = tiny_lm
    model = copy.deepcopy(model)
    with torch.no_grad():
        model.lm_head.weight *= 4
        model.lm_head.weight[tok.eos_token_id] *= 3
    return model, tok


def _hf(model, tok, ids, B, T):
    """HF's best sequence (generated part) and its score (None for B=1: HF goes greedy)."""
    x = torch.tensor([ids])
    out = model.generate(x, attention_mask=torch.ones_like(x), num_beams=B, do_sample=False,
                         max_new_tokens=T, length_penalty=1.0, early_stopping=False,
                         num_return_sequences=1, pad_token_id=tok.pad_token_id,
                         eos_token_id=tok.eos_token_id, return_dict_in_generate=True,
                         output_scores=True)
    score = None if B == 1 else float(out.sequences_scores[0])
    return out.sequences[0, len(ids):].tolist(), score


def _beam(model, tok, ids, B, T, **kw):
    return beam_search(model, ids, beam_width=B, max_new_tokens=T, eos_ids=tok.eos_token_id,
                       pad_id=tok.pad_token_id, **kw)


@pytest.mark.parametrize("lm", ["tiny_lm", "eos_lm"])
@pytest.mark.parametrize("B", [1, 2, 4])
def test_equals_hf_generate(lm, B, request):
    model, tok = request.getfixturevalue(lm)
    ended = stopped_early = 0
    for prompt in PROMPTS + ["7*7=", "3"]:
        ids = tok(prompt)["input_ids"]
        for T in (5, 24):
            res = _beam(model, tok, ids, B, T)
            tokens, score = _hf(model, tok, ids, B, T)
            assert res.tokens == tokens, (prompt, T)
            assert score is None or res.score == pytest.approx(score, abs=FP32_REORDER["atol"])
            ended += res.tokens[-1] == tok.eos_token_id
            stopped_early += len(res.alive_per_step) < T
    if lm == "eos_lm":  # finished hypotheses and the early-stop rule were exercised
        assert ended and (B == 1 or stopped_early)


@pytest.fixture(scope="module")
def multi_eos_lm(eos_lm):
    """eos_lm whose generation_config also lists a second EOS id, one that HF's beams emit."""
    model, tok = eos_lm
    model = copy.deepcopy(model)
    model.generation_config.eos_token_id = [tok.eos_token_id, tok.convert_tokens_to_ids("?")]
    return model, tok


@pytest.mark.parametrize("lm", ["tiny_lm", "eos_lm", "multi_eos_lm"])
@pytest.mark.parametrize("B", [1, 2, 4])
def test_batched_prompts_equal_hf_generate_one_by_one(lm, B, request):
    """Prompts of different lengths, left-padded into one batch, give HF's hypotheses."""
    from stopexp.search.stops import eos_ids

    model, tok = request.getfixturevalue(lm)
    prompts = PROMPTS + ["7*7=", "3"]
    ids = [tok(p)["input_ids"] for p in prompts]
    assert len({len(i) for i in ids}) == 4  # left padding of several widths
    eos = eos_ids(model, tok)
    for T in (5, 24):
        res = beam_search_batch(model, ids, beam_width=B, max_new_tokens=T, eos_ids=eos,
                                pad_id=tok.pad_token_id)
        for prompt_ids, r in zip(ids, res):
            x = torch.tensor([prompt_ids])
            out = model.generate(x, attention_mask=torch.ones_like(x), num_beams=B,
                                 do_sample=False, max_new_tokens=T, length_penalty=1.0,
                                 early_stopping=False, pad_token_id=tok.pad_token_id,
                                 return_dict_in_generate=True, output_scores=True)
            assert r.tokens == out.sequences[0, len(prompt_ids):].tolist(), (prompt_ids, T)
            if B > 1:
                assert r.score == pytest.approx(float(out.sequences_scores[0]), abs=FP32_REORDER["atol"])
            fed = r.n_forward_tokens - len(prompt_ids)  # padding is not counted
            assert sum(r.alive_per_step[:-1]) <= fed <= sum(r.alive_per_step)
    if lm == "multi_eos_lm":  # the second id really ended hypotheses
        assert any(r.tokens and r.tokens[-1] == eos[1] for r in res)


def _record(scorer):
    calls = []

    def wrapped(batch):
        calls.append({k: v.clone() for k, v in batch.items()})
        return scorer(batch)
    return wrapped, calls


def test_neutral_scorer_prunes_nothing_and_sees_true_features(tiny_lm):
    model, tok = tiny_lm
    ids, B, T = tok(PROMPTS[0])["input_ids"], 4, 12
    scorer, calls = _record(lambda batch: torch.zeros(len(batch["tokens"])))
    with Taps(model, [0, -1]) as taps:
        res = _beam(model, tok, ids, B, T, scorer=scorer, policy=TopK(B), taps=taps)
    assert res.tokens == _hf(model, tok, ids, B, T)[0]
    assert res.pruned_steps == [] and res.alive_per_step == [B] * (T - 1) + [0]
    assert res.check_calls == len(calls) == T - 1  # once per step, from the second on
    names = list(SIGNAL_NAMES)
    for t, batch in enumerate(calls, start=1):
        tokens = batch["tokens"]
        assert tokens.shape == (B, t) and batch["hidden"].shape == (B, 2, 32)
        # recompute each beam's features from a plain forward over its whole prefix
        full = torch.tensor([ids + row for row in tokens.tolist()])
        out = model(full, output_hidden_states=True)
        logp = torch.log_softmax(out.logits[:, len(ids) - 1 : -1].float(), -1)
        chosen = logp.gather(-1, tokens[:, :, None]).squeeze(-1)
        sig = batch["signals"]
        assert torch.allclose(sig[:, names.index("mean_logprob")], chosen.mean(1), **FP32_REORDER)
        assert torch.allclose(sig[:, names.index("min_logprob")], chosen.min(1).values, **FP32_REORDER)
        assert (sig[:, names.index("prefix_len")] == t).all()
        assert torch.allclose(batch["hidden"][:, 0], out.hidden_states[1][:, -1], **FP32_REORDER)
        norm = batch["hidden"][:, 1].norm(dim=-1)
        assert torch.allclose(sig[:, names.index("hidden_norm")], norm)
        assert torch.allclose(sig[:, names.index("hidden_mean")], batch["hidden"][:, 1].mean(-1))
        assert torch.allclose(sig[:, names.index("hidden_var")],
                              batch["hidden"][:, 1].var(-1, correction=0))


@pytest.mark.parametrize("patience", [1, 2, 3])
def test_delayed_verdict_prunes_marked_beams(tiny_lm, patience):
    model, tok = tiny_lm
    ids, B, T = tok(PROMPTS[0])["input_ids"], 4, 16
    unpruned = _hf(model, tok, ids, B, T)[0]
    bad = unpruned[0]  # penalise the unpruned winner's first token: pruning must matter

    def penalty(rows):
        return torch.tensor([-1.0 if bad in row else 1.0 for row in rows])

    scorer, calls = _record(lambda batch: penalty(batch["tokens"].tolist()))
    policy = FixedThreshold(0.0)
    fed = []  # (rows fed, cache rows) of every forward after the prefill

    def count_rows(module, args, kwargs):
        if kwargs["cache"].get_seq_length():
            fed.append((kwargs["input_ids"].shape[0], kwargs["cache"].layers[0].keys.shape[0]))

    hook = model.register_forward_pre_hook(count_rows, with_kwargs=True)
    try:
        with Taps(model, [-1]) as taps:
            res = _beam(model, tok, ids, B, T, scorer=scorer, policy=policy, taps=taps,
                        patience=patience)
    finally:
        hook.remove()

    # replay the verdicts: marks count along a beam's lineage and reset when it is kept
    marks, expected = {(): 0}, []
    for t, batch in enumerate(calls, start=1):
        rows = [tuple(r) for r in batch["tokens"].tolist()]
        keep = policy.keep(penalty(rows))
        marks = {r: 0 if k else marks[r[:-1]] + 1 for r, k in zip(rows, keep.tolist())}
        for r in rows:
            if marks[r] >= patience:
                expected.append(t)
                assert r.index(bad) <= t - patience  # it held the token for `patience` verdicts
    assert expected and res.pruned_steps == expected
    assert sum(res.pruned_per_step) == len(expected)
    assert res.check_calls == len(calls) == len(res.alive_per_step) - 1
    assert [len(b["tokens"]) for b in calls] == res.alive_per_step[:-1]
    # the width is kept (candidates never run out here), and the cache holds only live rows
    assert res.alive_per_step[:-1] == [B] * (len(res.alive_per_step) - 1)
    assert fed == [(n, n) for n in res.alive_per_step[:-1]]
    assert sum(res.alive_per_step[:-1]) + len(ids) == res.n_forward_tokens
    # avoidable here (some beam always lacked it, so the policy never had to keep one that
    # held it): it survives only where no verdict could reach it, in the last `patience` tokens
    assert not any(all(bad in r for r in b["tokens"].tolist()) for b in calls)
    assert res.tokens != unpruned and bad not in res.tokens[:-patience]


def test_scorer_needs_policy_and_taps(tiny_lm):
    model, tok = tiny_lm
    ids = tok(PROMPTS[1])["input_ids"]
    with pytest.raises(ValueError, match="policy"):
        _beam(model, tok, ids, 2, 4, scorer=lambda b: b["signals"][:, 0])
    with pytest.raises(ValueError, match="taps"):
        _beam(model, tok, ids, 2, 4, scorer=lambda b: b["signals"][:, 0], policy=TopK(2))


def test_checks_only_at_the_given_prefixes(tiny_lm):
    model, tok = tiny_lm
    ids, B, T = tok(PROMPTS[0])["input_ids"], 4, 12
    scorer, calls = _record(lambda batch: -batch["tokens"][:, -1].float())
    with Taps(model, [-1]) as taps:
        res = _beam(model, tok, ids, B, T, scorer=scorer, policy=FixedThreshold(0.0), taps=taps,
                    patience=1, check_steps={3, 7})
    assert res.check_calls == 2 and [c["tokens"].shape[1] for c in calls] == [3, 7]
    assert set(res.pruned_steps) <= {3, 7}


def test_beam_oracle_needs_a_process_check():
    from stopexp.evaluation.beam import NOT_REPORTED, oracle_refusal
    from stopexp.tasks.arith import ArithTask
    from stopexp.tasks.datatotext import DataToTextTask
    from stopexp.tasks.wordprob import WordProblemTask

    assert oracle_refusal(ArithTask()) is None
    assert oracle_refusal(WordProblemTask()) is None  # its intermediate values are checked
    assert oracle_refusal(DataToTextTask()) == (  # no step check nor values read
        "task 'datatotext' has no process check (no first wrong step can be read from a prefix), so a "
        "beam oracle would score every live beam alike and never prune; the oracle is left out "
        "of beam search for it")
    assert NOT_REPORTED["auroc"].startswith("beams are not independent paths")


def test_beam_oracle_reads_the_completed_values_of_a_word_problem():
    """Ella has 4 pens, finds 3 more, gets 1 more: values 7 then 8. A value is read once a
    non-digit follows it (a trailing number may still grow)."""
    from stopexp.evaluation.beam import prefix_has_error
    from stopexp.tasks.wordprob import WordProblemTask

    task = WordProblemTask(steps=(2,), number_range=(1, 5), solution_style="lines")
    problem = task.problems("test", 1)[0]
    assert (problem.values, problem.answer) == ((7, 8), 8)
    head = "Ella has 4 pens and finds 3 more, so 4 + 3 = "
    cases = {head: False, head + "1": False, head + "17": False, head + "17.": True,
             head + "7. Now Ella has 7 pens.\nThen she gets 1 more, so 7 + 1 = 9": False,
             head + "7. Now Ella has 7 pens.\nThen she gets 1 more, so 7 + 1 = 9.": True,
             head + "7. Now Ella has 7 pens.\nThen she gets 1 more, so 7 + 1 = 8.\n": False,
             head + "7.\nThen 7 + 1 = 8.\nThe answer is 9.": True,
             head + "7.\nThen 7 + 1 = 8.\nThe answer is 9": False,  # a number at the end is not read yet
             head + "7.\nThen 7 + 1 = 8.\nThe answer is 1,0": False,  # a thousands separator
             head + "7.\nThen 7 + 1 = 8.\nThe answer is 8.": False}
    assert {text: prefix_has_error(task, problem, text) for text in cases} == cases


@pytest.mark.parametrize("layers", [[0, -1], [-1, 0], ["last", "first"]])
def test_hidden_norm_reads_the_deepest_tapped_layer_whatever_the_order(tiny_lm, layers):
    model, tok = tiny_lm
    ids = tok(PROMPTS[0])["input_ids"]
    scorer, calls = _record(lambda batch: torch.zeros(len(batch["tokens"])))
    with Taps(model, layers) as taps:
        assert taps.layers == [0, 1]
        _beam(model, tok, ids, 2, 4, scorer=scorer, policy=TopK(2), taps=taps)
    batch = calls[0]
    full = torch.tensor([ids + row for row in batch["tokens"].tolist()])
    seen = {}
    hook = model.model.layers[1].register_forward_hook(lambda m, a, out: seen.update(h=out))
    try:
        model(full)  # hidden_states[-1] would be after the final norm: hook the layer instead
    finally:
        hook.remove()
    deepest = seen["h"][:, -1]  # layer 1's output
    assert torch.allclose(deepest, batch["hidden"][:, 1], **FP32_REORDER)
    assert torch.allclose(batch["signals"][:, SIGNAL_NAMES.index("hidden_norm")],
                          deepest.norm(dim=-1), atol=1e-4)


def _last_token_scorer(batch):
    """A stateless signal of each row alone: beams whose newest token is odd are refused."""
    return 1.0 - (batch["tokens"][:, -1] % 2).float() * 2


def test_batched_pruning_decides_prompt_by_prompt_like_one_at_a_time(tiny_lm):
    model, tok = tiny_lm
    ids = [tok(p)["input_ids"] for p in PROMPTS]
    kw = dict(beam_width=4, max_new_tokens=12, eos_ids=tok.eos_token_id, pad_id=tok.pad_token_id,
              scorer=_last_token_scorer, policy=FixedThreshold(0.0), patience=1)
    for refill in (True, False):
        with Taps(model, [-1]) as taps:
            batched = beam_search_batch(model, ids, taps=taps, refill=refill, **kw)
            single = [beam_search(model, i, taps=taps, refill=refill, **kw) for i in ids]
        for b, s in zip(batched, single):
            assert (b.tokens, b.pruned_steps, b.alive_per_step, b.n_forward_tokens) == (
                s.tokens, s.pruned_steps, s.alive_per_step, s.n_forward_tokens)
        assert sum(len(b.pruned_steps) for b in batched) > 0


def test_without_refill_the_beam_narrows(tiny_lm):
    model, tok = tiny_lm
    ids, B, T = tok(PROMPTS[0])["input_ids"], 4, 12
    kw = dict(scorer=_last_token_scorer, policy=FixedThreshold(0.0), patience=1)
    with Taps(model, [-1]) as taps:
        kept = _beam(model, tok, ids, B, T, taps=taps, refill=True, **kw)
        narrow = _beam(model, tok, ids, B, T, taps=taps, refill=False, **kw)
    assert kept.alive_per_step[1:-1] == [B] * (len(kept.alive_per_step) - 2)
    # each pruned beam takes one slot away for good (the width is 1 at t=0: one prompt row)
    width = B
    for t, n in enumerate(narrow.pruned_per_step):
        width -= n
        assert narrow.alive_per_step[t] <= max(width, 1), t
    assert narrow.pruned_steps and min(narrow.alive_per_step[1:]) < B
    assert narrow.n_forward_tokens < kept.n_forward_tokens
    assert narrow.tokens  # a hypothesis still comes out


class _RefuseAll:
    """A policy that refuses every beam (no threshold policy does: they keep the best)."""

    def keep(self, scores):
        return torch.zeros(len(scores), dtype=torch.bool)


@pytest.mark.parametrize("refill", [True, False])
def test_a_prompt_keeps_its_best_beam_when_all_would_be_pruned(tiny_lm, refill):
    model, tok = tiny_lm
    ids, B, T = tok(PROMPTS[0])["input_ids"], 4, 10
    best_row = 2

    def scorer(batch):
        s = torch.zeros(len(batch["tokens"]))
        s[min(best_row, len(s) - 1)] = 1.0
        return s

    with Taps(model, [-1]) as taps:
        res = _beam(model, tok, ids, B, T, scorer=scorer, policy=_RefuseAll(), taps=taps,
                    patience=1, refill=refill)
    assert res.tokens and len(res.tokens) == T  # one beam always runs on to the end
    assert res.pruned_per_step[1] == B - 1  # at the first check all but the best go
    if not refill:
        assert res.alive_per_step[1:-1] == [1] * (T - 2)

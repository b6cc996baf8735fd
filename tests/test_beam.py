import copy

import pytest
import torch

from stopexp.policies import FixedThreshold, TopK
from stopexp.search.beam import beam_search
from stopexp.signals.features import SIGNAL_NAMES
from stopexp.taps import Taps

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
            assert score is None or res.score == pytest.approx(score, abs=1e-5)
            ended += res.tokens[-1] == tok.eos_token_id
            stopped_early += len(res.alive_per_step) < T
    if lm == "eos_lm":  # finished hypotheses and the early-stop rule were exercised
        assert ended and (B == 1 or stopped_early)


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
        assert torch.allclose(sig[:, names.index("mean_logprob")], chosen.mean(1), atol=1e-5)
        assert torch.allclose(sig[:, names.index("min_logprob")], chosen.min(1).values, atol=1e-5)
        assert (sig[:, names.index("prefix_len")] == t).all()
        assert torch.allclose(batch["hidden"][:, 0], out.hidden_states[1][:, -1], atol=1e-5)
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
    from stopexp.evaluate_beam import NOT_REPORTED, oracle_refusal

    assert oracle_refusal("arith") is None
    assert oracle_refusal("qa") == (
        "task 'qa' has no process check (no first wrong step can be read from a prefix), so a "
        "beam oracle would score every live beam alike and never prune; the oracle is left out "
        "of beam search for it")
    assert NOT_REPORTED["auroc"].startswith("beams are not independent paths")


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
    assert torch.allclose(deepest, batch["hidden"][:, 1], atol=1e-5)
    assert torch.allclose(batch["signals"][:, SIGNAL_NAMES.index("hidden_norm")],
                          deepest.norm(dim=-1), atol=1e-4)

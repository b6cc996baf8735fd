"""Stop strings split by tokens that decode to nothing (special tokens, skipped in the
text): found where a search of the decoded text finds them, by the engine, beam search and
`StopStrings` alike (SmolLM2's BPE case: tests/test_stops_hf.py)."""
import torch

from stopexp.search.beam import beam_search
from stopexp.search.decode import SamplingParams, make_engine
from stopexp.search.stops import StopStrings

PROMPT = "4+7*3-9?"
T = 24


def _text_level_end(tok, tokens, stops) -> int:
    """The reference: the first k whose decoded text tokens[:k] holds a stop (0 if none)."""
    return next((k for k in range(1, len(tokens) + 1)
                 if any(s in tok.decode(tokens[:k], skip_special_tokens=True) for s in stops)), 0)


def _scripted(tok, text_with_blanks: str) -> list[int]:
    """Token ids of `text_with_blanks`, where "_" stands for a run of special tokens
    (<s>, <pad>, <unk>: each decodes to nothing)."""
    blanks = [tok.bos_token_id, tok.pad_token_id, tok.unk_token_id, tok.bos_token_id]
    ids = []
    for c in text_with_blanks:
        ids += blanks if c == "_" else tok.convert_tokens_to_ids([c])
    return ids


def test_stop_split_by_blank_tokens_is_found_like_the_text_level_search(tiny_lm):
    _, tok = tiny_lm
    for stops, script in ((["4+"], "13*4_+9=2"), (["4+"], "1_3_4_+_9"), (["=2", "*4+"], "9*_4__+=2"),
                          (["99"], "9_9"), (["4+"], "13*4_-4_+")):
        tokens = _scripted(tok, script)
        want = _text_level_end(tok, tokens, stops)
        assert want  # every script holds a stop, split by blank tokens
        stop = StopStrings(stops, tok)
        tail, ended = [], 0
        for k, token in enumerate(tokens, 1):  # as the engine keeps its tails
            tail = stop.trim(tail + [token])
            if stop.hits([tail])[0]:
                ended = k
                break
        assert ended == want, (stops, script)
        # beam search hands the whole sequence: the same answer
        assert stop.hits([tokens[:want]]) == [True] and stop.hits([tokens[:want - 1]]) == [False]
    # a window of the last max-bytes + 2 tokens, blanks included, would miss it
    tokens = _scripted(tok, "13*4_+")
    assert "4+" not in tok.decode(tokens[-StopStrings(["4+"], tok).window:], skip_special_tokens=True)


def _force(model, script: list[int]):
    """A hook making the LM head put all mass on script[i] at the i-th forward (the
    prompt's prefill gives the first token), for every row."""
    calls = {"n": 0}

    def hook(module, args, out):
        i = min(calls["n"], len(script) - 1)
        calls["n"] += 1
        out = torch.full_like(out, -1e4)
        out[..., script[i]] = 0.0
        return out
    return model.lm_head.register_forward_hook(hook)


def test_engine_and_beam_search_end_at_a_stop_split_by_special_tokens(tiny_lm):
    model, tok = tiny_lm
    script = _scripted(tok, "13*4_+9=2") + tok.convert_tokens_to_ids(list("123456"))
    want = _text_level_end(tok, script, ["4+"])
    ids = tok(PROMPT)["input_ids"]
    handle = _force(model, script)
    try:
        eng = make_engine(model, tok, SamplingParams(max_new_tokens=T, do_sample=False, stop=("4+",)))
        state = eng.run(eng.launch([ids], [0]))
    finally:
        handle.remove()
    tokens, *_, lengths = state.tensors(tok.pad_token_id)
    assert tokens[0, : lengths[0]].tolist() == script[:want] and bool(state.finished[0])
    handle = _force(model, script)
    try:
        res = beam_search(model, ids, beam_width=1, max_new_tokens=T, eos_ids=tok.eos_token_id,
                          pad_id=tok.pad_token_id, stop=("4+",), tokenizer=tok)
    finally:
        handle.remove()
    assert res.tokens == script[:want]

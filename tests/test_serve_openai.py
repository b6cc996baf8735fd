"""OpenAI's and vLLM's meaning of a completion request, on the toy LM and the hf engine
through the official `openai` client: `n` choices out of `paths` sampled paths, the best
distinct answers first; stop strings left out of the text; vLLM's sampling extras each
changing the output (or refused with a 400 naming the field); per-token log-probs and echo
equal to a teacher-forced forward of the LM; lists of prompts answered prompt-major."""
import math
from types import SimpleNamespace

import httpx
import openai
import pytest
import torch
from transformers import RepetitionPenaltyLogitsProcessor

from stopexp.search.decode import SamplingParams
from stopexp.search.logits import Counts, adjust_logits
from stopexp.search.sample import prompt_ids
from stopexp.search.stops import split_stop
from stopexp.tasks import build_task
from test_serve import error_of, prompts_of, running, trained  # noqa: F401  (trained: the fixture)

MAX = 64  # max_tokens of these requests (serve.max_tokens)


@pytest.fixture(scope="module")
def served(trained):  # noqa: F811
    with running(trained) as s:
        yield s


def ask(served, **fields):
    extra = {k: fields.pop(k) for k in list(fields) if k in ("paths", "prune", "top_k", "min_p",
                                                            "repetition_penalty", "min_tokens", "ignore_eos",
                                                            "include_stop_str_in_output")}
    return served.client.completions.create(model="toy", max_tokens=MAX, extra_body=extra, **fields)


def unpruned(served, prompt, **fields) -> list[str]:
    """The texts of all 8 paths of `prompt` (seed 0, unpruned), in the vote's order."""
    return [c.text for c in ask(served, prompt=prompt, n=8, paths=8, prune=False, seed=0, **fields).choices]


def test_n_is_the_number_of_choices_the_best_distinct_answers_first(served):
    task = build_task(served.cfg.task)
    prompt = prompts_of(1)[0]
    r = ask(served, prompt=prompt, n=3, paths=8, seed=0, prune=False)
    info = r.model_extra["stopexp"]
    assert [c.index for c in r.choices] == [0, 1, 2] and info["paths_launched"] == 8
    answers = [task.answer_of(c.text) for c in r.choices]
    assert answers[0] == info["vote"]["winner"]
    votes = info["vote"]["counts"]
    distinct = list(dict.fromkeys(answers))
    assert answers[:len(distinct)] == distinct  # distinct answers before any repeat
    assert [votes[a] for a in distinct] == sorted((votes[a] for a in distinct), reverse=True)
    by_path = info["vote"]["answers"]
    # each distinct answer is answered by its first path
    assert info["vote"]["choice_paths"][:len(distinct)] == [
        min(int(j) for j, a in by_path.items() if a == answer) for answer in distinct]
    one = ask(served, prompt=prompt, paths=8, seed=0, prune=False)
    assert len(one.choices) == 1 and one.choices[0].text == r.choices[0].text
    assert one.usage == r.usage  # the same 8 paths ran


def test_a_pruned_request_keeps_a_path_for_each_choice(served):
    prompt = prompts_of(2)[1]
    one = ask(served, prompt=prompt, seed=0).model_extra["stopexp"]
    five = ask(served, prompt=prompt, n=5, seed=0).model_extra["stopexp"]
    assert one["paths_kept"] == 3 and five["paths_kept"] == 5  # the policy keeps 3 of 8
    check = five["checks"][0]
    assert set(one["checks"][0]["kept"]) < set(check["kept"]) and len(check["kept"]) == 5
    scores = {int(j): s for j, s in check["scores"].items()}
    assert min(scores[j] for j in check["kept"]) >= max(s for j, s in scores.items() if j not in check["kept"])


def test_stop_strings_are_left_out_of_the_text_and_the_vote_still_has_a_winner(served):
    prompt = "4-7+8-2-3*9*9?"
    cut = ask(served, prompt=prompt, stop=";", seed=0, n=2)
    kept = ask(served, prompt=prompt, stop=";", seed=0, n=2, include_stop_str_in_output=True)
    assert [c.text for c in kept.choices] == [c.text + ";" for c in cut.choices]
    assert all(";" not in c.text and c.text for c in cut.choices)
    vote = cut.model_extra["stopexp"]["vote"]
    assert vote["winner"] == cut.choices[0].text  # no answer mark before the stop: the texts vote
    assert split_stop("1=1;#1", [";", "#"]) == ("1=1", ";") and split_stop("ab", ["x"]) == ("ab", "")


@pytest.mark.parametrize("field, value, message", [
    ("temperature", 2.5, "temperature: must be a number in [0, 2], got 2.5"),
    ("top_p", 0, "top_p: must be a number in (0, 1], got 0"),
    ("presence_penalty", -2.5, "presence_penalty: must be a number in [-2, 2], got -2.5"),
    ("frequency_penalty", 3, "frequency_penalty: must be a number in [-2, 2], got 3"),
    ("min_p", 1.5, "min_p: must be a number in [0, 1], got 1.5"),
    ("repetition_penalty", 0, "repetition_penalty: must be a number in (0, 4.29497e+09], got 0"),
    ("top_k", -2, None),
    ("min_tokens", MAX + 1, f"min_tokens: must lie in 0..{MAX} (max_tokens), got {MAX + 1}"),
    ("ignore_eos", "yes", "ignore_eos: true or false is expected, got 'yes'"),
    ("include_stop_str_in_output", 1, None),
    ("seed", -1, None),
    ("logit_bias", {"5": 101}, "logit_bias.5: must be a number in [-100, 100], got 101"),
    ("logit_bias", {"x": 1}, None),
    ("logprobs", 21, "logprobs: must lie in 0..20, got 21"),
    ("echo", "yes", None),
    ("best_of", 2, "best_of: 2 is not supported by this server; the paths sampled per prompt are `paths`"),
    ("max_tokens", 0, f"max_tokens: must lie in 1..{MAX} (serve.max_tokens), got 0"),  # 0: only with echo
    ("n", 9, "n: must lie in 1..8 (the paths sampled: `paths`), got 9"),
])
def test_a_value_outside_openais_or_vllms_range_is_a_400_naming_the_field(served, field, value, message):
    body = {"model": "toy", "prompt": "3+4?", "max_tokens": MAX, "paths": 8, field: value}
    got = error_of(httpx.post(f"{served.url}/v1/completions", json=body))
    assert got.split(":")[0] == field.split(".")[0] or got.startswith(f"{field}.")
    if message is not None:
        assert got == message


def test_top_k_top_p_and_min_p_narrowed_to_one_token_sample_the_greedy_path(served):
    prompt = prompts_of(3)[2]
    greedy = ask(served, prompt=prompt, temperature=0, seed=0).choices[0].text
    sampled = unpruned(served, prompt)
    assert set(sampled) != {greedy}
    for narrow in ({"top_k": 1}, {"min_p": 1.0}, {"top_p": 1e-9}):
        assert unpruned(served, prompt, **narrow) == [greedy] * 8, narrow


@pytest.mark.parametrize("penalty", [{"repetition_penalty": 1.8}, {"presence_penalty": 2.0},
                                     {"frequency_penalty": 2.0}, {"presence_penalty": -2.0}])
def test_each_penalty_changes_the_paths(served, penalty):
    prompt = prompts_of(1)[0]
    assert unpruned(served, prompt, temperature=2.0, **penalty) != unpruned(served, prompt, temperature=2.0)


def test_min_tokens_and_ignore_eos_lengthen_the_paths(served):
    prompt = prompts_of(1)[0]
    lengths = lambda r: [p["tokens"] for p in r.model_extra["stopexp"]["paths"]]  # noqa: E731
    plain = ask(served, prompt=prompt, n=8, paths=8, prune=False, seed=0)
    assert max(lengths(plain)) < 45
    longer = ask(served, prompt=prompt, n=8, paths=8, prune=False, seed=0, min_tokens=45)
    assert min(lengths(longer)) >= 45
    endless = ask(served, prompt=prompt, n=8, paths=8, prune=False, seed=0, ignore_eos=True)
    assert lengths(endless) == [MAX] * 8 and {c.finish_reason for c in endless.choices} == {"length"}


def test_logit_bias_and_the_seed(served):
    tokenizer = served.service.reader.tokenizer
    nine = tokenizer.convert_tokens_to_ids("9")
    prompt = prompts_of(1)[0]
    assert unpruned(served, prompt, logit_bias={str(nine): 100}) == ["9" * MAX] * 8
    first = ask(served, prompt=prompt, n=4, seed=1, prune=False)
    assert [c.text for c in ask(served, prompt=prompt, n=4, seed=1, prune=False).choices] == \
        [c.text for c in first.choices]
    assert [c.text for c in ask(served, prompt=prompt, n=4, seed=2, prune=False).choices] != \
        [c.text for c in first.choices]


def test_penalties_are_vllms_and_hfs():
    """adjust_logits: the repetition penalty as transformers' processor over prompt and
    output, frequency and presence penalties over the output's counts, the bias added, EOS
    masked under min_tokens (values exact in float32)."""
    logits = torch.tensor([[2.0, -1.0, 0.5, 4.0, -3.0], [1.0, 1.0, -2.0, 0.0, 3.0]])
    counts = Counts.of([[0], [4]], 5, "cpu")
    counts.add(torch.tensor([1, 2]))
    counts.add(torch.tensor([1, 3]))
    rep = adjust_logits(logits, SamplingParams(repetition_penalty=2.0), 2, (4,), counts)
    hf = RepetitionPenaltyLogitsProcessor(2.0)
    assert torch.equal(rep[0], hf(torch.tensor([[0, 1, 1]]), logits[:1].clone())[0])
    assert torch.equal(rep[1], hf(torch.tensor([[4, 2, 3]]), logits[1:].clone())[0])
    got = adjust_logits(logits, SamplingParams(frequency_penalty=0.5, presence_penalty=0.25), 2, (4,), counts)
    assert got.tolist() == [[2.0, -1.0 - 1.0 - 0.25, 0.5, 4.0, -3.0], [1.0, 1.0, -2.0 - 0.5 - 0.25, -0.75, 3.0]]
    masked = adjust_logits(logits, SamplingParams(min_tokens=3, logit_bias=((0, 1.5),)), 2, (4,), None)
    assert masked[:, 4].tolist() == [-math.inf] * 2 and masked[:, 0].tolist() == [3.5, 2.5]
    assert adjust_logits(logits, SamplingParams(min_tokens=2), 2, (4,), None) is logits


def test_vllm_takes_every_sampling_extra():
    pytest.importorskip("vllm")
    from stopexp.search.vllm_engine import VllmEngine

    params = SamplingParams(min_p=0.1, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=-0.5,
                            min_tokens=3, ignore_eos=True, logit_bias=((7, 2.5),), top_k=4)
    engine = VllmEngine(None, SimpleNamespace(max_logprobs=5), SamplingParams(), (2,), None)
    got = engine.request(0, params=params)
    assert (got.min_p, got.repetition_penalty, got.presence_penalty, got.frequency_penalty, got.min_tokens,
            got.ignore_eos, got.logit_bias, got.top_k, got.stop_token_ids) == (
        0.1, 1.3, 0.5, -0.5, 3, True, {7: 2.5}, 4, [])
    assert engine.request(0).stop_token_ids == [2] and engine.request(0).logit_bias is None


def forward_logprobs(served, ids: list[int]) -> torch.Tensor:
    model = served.service.loop.stepper.engine_for(None).model
    with torch.no_grad():
        return torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)


def test_logprobs_of_a_choice_are_the_lms_teacher_forced_ones(served):
    tokenizer = served.service.reader.tokenizer
    prompt = prompts_of(1)[0]
    r = ask(served, prompt=prompt, logprobs=2, seed=0)
    c = r.choices[0]
    ids = prompt_ids(tokenizer, prompt)
    gen = [tokenizer.convert_tokens_to_ids(t) for t in c.logprobs.tokens]
    assert "".join(c.logprobs.tokens).startswith(c.text)
    full = forward_logprobs(served, ids + gen)
    want = [float(full[len(ids) - 1 + k, t]) for k, t in enumerate(gen)]
    assert c.logprobs.token_logprobs == want
    top = full[len(ids) - 1].topk(2)
    assert c.logprobs.top_logprobs[0] == {tokenizer.decode([i]): float(v) for i, v in zip(
        top.indices.tolist(), top.values.tolist())} | {c.logprobs.tokens[0]: want[0]}
    assert c.logprobs.text_offset == [sum(len(t) for t in c.logprobs.tokens[:k]) for k in range(len(gen))]


def test_echo_scores_a_batch_of_token_prompts_as_lm_eval_asks(served):
    """lm-eval's loglikelihood request: token ids, echo, max_tokens 1, logprobs 1, greedy;
    it sums token_logprobs[ctxlen:-1]. And echo with max_tokens 0 scores the prompt alone."""
    tokenizer = served.service.reader.tokenizer
    texts = [("3+4?", "7"), ("9*9?", "1")]
    prompts = [tokenizer(a + b)["input_ids"] for a, b in texts]
    r = served.client.completions.create(model="toy", prompt=prompts, echo=True, max_tokens=1, logprobs=1,
                                         temperature=0, seed=0)
    assert [c.index for c in r.choices] == [0, 1]
    assert r.usage.prompt_tokens == sum(map(len, prompts))
    for c, ids, (context, _) in zip(r.choices, prompts, texts):
        ctxlen = len(tokenizer(context)["input_ids"])
        lp = c.logprobs.token_logprobs
        assert len(lp) == len(ids) + 1 and lp[0] is None
        full = forward_logprobs(served, ids)
        assert lp[ctxlen:-1] == [float(full[k - 1, ids[k]]) for k in range(ctxlen, len(ids))]
    only = served.client.completions.create(model="toy", prompt=prompts[0], echo=True, max_tokens=0, logprobs=0)
    assert only.choices[0].logprobs.token_logprobs == r.choices[0].logprobs.token_logprobs[:-1]
    assert only.choices[0].text == tokenizer.decode(prompts[0]) and only.usage.completion_tokens == 0
    with pytest.raises(openai.BadRequestError, match="stream: a list of prompts"):
        served.client.completions.create(model="toy", prompt=prompts, stream=True)


def test_a_list_of_prompts_is_answered_prompt_major_with_usage_summed(served):
    prompts = prompts_of(2)
    both = ask(served, prompt=prompts, n=2, seed=5)
    alone = [ask(served, prompt=p, n=2, seed=5) for p in prompts]
    assert [c.index for c in both.choices] == [0, 1, 2, 3]
    assert [c.text for c in both.choices] == [c.text for r in alone for c in r.choices]
    assert both.usage.completion_tokens == sum(r.usage.completion_tokens for r in alone)
    assert both.usage.total_tokens == sum(r.usage.total_tokens for r in alone)
    assert [s["tokens_generated"] for s in both.model_extra["stopexp"]] == [r.usage.completion_tokens for r in alone]

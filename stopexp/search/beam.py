"""Beam search with per-step pruning by a signal (the "delayed verdict" protocol), for
several prompts in one batch.

Without a scorer this is HF's beam search (`generate(num_beams=B, do_sample=False,
early_stopping=False)`), rewritten on our own cache so that rows can leave it. Each step
takes, per prompt, the top 2B (beam, token) continuations by summed log-prob; EOS
continuations among the top B become finished hypotheses scored
sum_logprob / n_generated**length_penalty (EOS counted); the best B others run on. Any of
the model's EOS ids ends a hypothesis, and so does a token that completes a stop string
(stopexp.search.stops: the token is kept). A prompt's search ends at max_new_tokens (where
the top B continuations all finish) or once B hypotheses are finished and its best running
beam, divided by its current length**length_penalty, cannot beat the worst of them.

Prompts are batched: the beams of all prompts are the rows of one forward (prompts
left-padded, an attention mask, position ids from the mask), each prompt's rows
contiguous; a prompt whose search ended leaves the batch and the cache.

With a scorer, each checked step first scores all live beams of all prompts in one call.
Their newest token has been fed, so the taps hold its hidden state and the features are
those a trace bank keeps at a checkpoint of the same length. The policy decides prompt by
prompt. A beam the policy refuses is marked; marks count along a beam's lineage (a
continuation inherits its parent's count, a kept beam resets it), and a beam marked
`patience` steps in a row is pruned: it gets no continuations. With `refill` (the seed's
protocol) the step's 2B candidates come from the survivors and the pruned beams' slots go
to the next best of them, so the width is kept. Without it the prompt's beam width shrinks
by one per pruned beam (a pruned beam is not replaced: fewer rows, fewer tokens); its
candidates, finishing slots and stopping rule then use the current width w (2w
candidates, the top w may finish, done once w hypotheses are finished and none can be
beaten). If every live beam of a prompt would be pruned, the best by signal stays (the
threshold policies never let this happen: the beam they keep has no mark). Pruned rows
leave the KV cache at the step's reorder.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from stopexp.core.policies import quantize
from stopexp.search.decode import check_finite
from stopexp.search.stops import StopStrings
from stopexp.signals.columns import signal_matrix
from stopexp.signals.confidence import entropy, token_confidence


@dataclass
class BeamResult:
    tokens: list[int]             # the best hypothesis' generated tokens (EOS included)
    score: float                  # its sum of log-probs / len**length_penalty
    pruned_steps: list[int] = field(default_factory=list)     # per pruned beam: its length then
    alive_per_step: list[int] = field(default_factory=list)   # beams carried on from each step
    pruned_per_step: list[int] = field(default_factory=list)
    n_forward_tokens: int = 0     # tokens fed through the model, prompt included (no padding)
    check_calls: int = 0          # steps at which this prompt's beams were scored
    check_seconds: float = 0.0    # its share (by rows) of the batched checks' time


@dataclass
class _Prompt:
    """One prompt's search besides its live rows: width, finished hypotheses, result."""
    width: int
    fin_scores: torch.Tensor                 # (B,) best first; -inf marks an empty slot
    fin_tokens: list                         # B entries, None for an empty slot
    res: BeamResult
    done: bool = False


def _token_stats(logprobs: torch.Tensor, conf_topk: int) -> torch.Tensor:
    """(R, 2): entropy and DeepConf confidence of each row's next-token distribution."""
    return torch.stack([entropy(logprobs), token_confidence(logprobs, conf_topk)], -1)


def _features(tokens: torch.Tensor, stats: torch.Tensor, hidden: torch.Tensor,
              window: int, attn: torch.Tensor | None = None) -> dict:
    """The predictor batch (stopexp.signals.feature_spec) for the live beams, plus their tokens
    for rule-based scorers; on the model's device, tokens on the CPU. `attn`: (R,)
    attention entropy, None when not tapped."""
    R, t = tokens.shape
    prefix = torch.full((R,), t)
    signals = signal_matrix(stats[:, 0], stats[:, 1], stats[:, 2], prefix, window, hidden, attn)
    return {"hidden": hidden.float(), "signals": signals.to(hidden.device),
            "prefix_len": prefix.float().to(hidden.device), "tokens": tokens}


def _groups(owner: torch.Tensor) -> list[tuple[int, int, int]]:
    """(prompt, first row, end row) of each prompt's contiguous rows, in row order."""
    ids, counts = torch.unique_consecutive(owner, return_counts=True)
    ends = counts.cumsum(0).tolist()
    return [(int(i), e - int(c), e) for i, c, e in zip(ids, counts, ends)]


def _beam_label(groups, row: int, n_prompts: int) -> str:
    """Row `row` named in error messages: "beam j" (its index among its prompt's beams),
    after "prompt i" when the batch holds several prompts."""
    i, a = next((i, a) for i, a, b in groups if a <= row < b)
    return f"beam {row - a}" if n_prompts == 1 else f"prompt {i} beam {row - a}"


def beam_search(model, prompt_ids: list[int], **kw) -> BeamResult:
    """Beam search for one prompt: `beam_search_batch` with a batch of one."""
    return beam_search_batch(model, [prompt_ids], **kw)[0]


@torch.no_grad()
def beam_search_batch(model, prompts: list[list[int]], *, beam_width: int, max_new_tokens: int,
                      eos_ids, pad_id: int, scorer=None, policy=None, patience: int = 2,
                      taps=None, length_penalty: float = 1.0, group_window: int = 8,
                      conf_topk: int = 5, check_steps=None, stop=(), tokenizer=None,
                      refill: bool = True) -> list[BeamResult]:
    """Beam search for every prompt of `prompts` (token ids, unpadded) in one batch of at
    most len(prompts) * beam_width rows; one BeamResult per prompt, in order. `pad_id`
    left-pads the shorter prompts. `eos_ids`: one id or several (stopexp.search.stops
    .eos_ids). `scorer(batch) -> (R,)` scores the R live beams of all prompts (higher =
    better) from the batch of `_features`, whose "owner" (R,) gives each row's prompt
    index; it needs `policy` (asked prompt by prompt) and active `taps`. `check_steps`
    (prefix lengths) limits the checks to those steps; None checks every step. `refill`:
    see the module docstring. `stop`: stop strings, checked with `tokenizer`. Raises
    ValueError on bad arguments, FloatingPointError on NaN log-probs."""
    if (scorer is None) != (policy is None):
        raise ValueError("beam_search: scorer and policy go together")
    if scorer is not None and taps is None:
        raise ValueError("beam_search: a scorer needs taps (the hidden states it is fed)")
    if not prompts or any(not p for p in prompts):
        raise ValueError("beam_search: a prompt is empty (or none was given)")
    for name, value in (("beam_width", beam_width), ("max_new_tokens", max_new_tokens),
                        ("patience", patience)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"beam_search: {name} must be a whole number >= 1, got {value!r}")
    if check_steps is not None and not len(check_steps):
        raise ValueError("beam_search: check_steps is empty (no step would be checked); give "
                         "the prefix lengths to check, or None for every step")
    B, device = beam_width, next(model.parameters()).device
    eos = torch.tensor([eos_ids] if isinstance(eos_ids, int) else list(eos_ids))
    stops = StopStrings(stop, tokenizer) if stop else None
    P, L = len(prompts), max(map(len, prompts))
    ids = torch.full((P, L), pad_id, dtype=torch.long)
    mask = torch.zeros((P, L), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, L - len(p):], mask[i, L - len(p):] = torch.tensor(p), 1
    ids, mask = ids.to(device), mask.to(device)
    cache = DynamicCache(config=model.config)
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
                   use_cache=True).logits[:, -1, :].float()
    positions = positions[:, -1] + 1                   # of the next token, per row
    searches = [_Prompt(B, torch.full((B,), float("-inf"), device=device), [None] * B,
                        BeamResult(tokens=[], score=float("-inf"), n_forward_tokens=len(p)))
                for p in prompts]

    # The live beams, one cache row each, a prompt's rows contiguous. Scores stay float32
    # on the device, as in HF.
    owner = torch.arange(P)                            # prompt of each row
    seqs = torch.zeros(P, 0, dtype=torch.long)         # generated tokens
    scores = torch.zeros(P, device=device)             # summed log-probs
    marks = torch.zeros(P, dtype=torch.long)           # consecutive refusals
    stats = torch.zeros(P, 3, 0)                       # per token: log-prob, entropy, conf

    for t in range(max_new_tokens):                    # t = tokens each live beam holds
        logprobs = torch.log_softmax(logits, dim=-1)
        groups = _groups(owner)
        check_finite(logprobs, t, lambda r: _beam_label(groups, r, P))
        pruned = torch.zeros(len(seqs), dtype=torch.bool)
        if scorer is not None and t > 0 and (check_steps is None or t in check_steps):
            start = time.perf_counter()
            batch = _features(seqs, stats, taps.read(), group_window,
                              taps.attention_entropy() if taps.attention else None)
            batch["owner"] = owner.clone()
            signal = scorer(batch).float().cpu()
            for i, a, b in groups:
                s = searches[i]
                keep = policy.keep(signal[a:b])
                marks[a:b] = torch.where(keep, 0, marks[a:b] + 1)
                out = marks[a:b] >= patience
                if out.all():  # a prompt never loses all its beams: the best stays
                    out[int(torch.argmax(quantize(signal[a:b])))] = False
                pruned[a:b] = out
                s.res.check_calls += 1
                s.res.pruned_steps += [t] * int(out.sum())
                if not refill:
                    s.width -= int(out.sum())
            spent = time.perf_counter() - start
            for i, a, b in groups:
                searches[i].res.check_seconds += spent * (b - a) / len(seqs)

        parents, tokens, new_scores = [], [], []
        for i, a, b in groups:
            s = searches[i]
            s.res.pruned_per_step.append(int(pruned[a:b].sum()))
            run = _step_prompt(s, B, logprobs[a:b], scores[a:b], pruned[a:b], seqs[a:b], t,
                               eos, stops, max_new_tokens, length_penalty)
            if run is None:
                s.done = True
                continue
            rows, token, cand = run
            parents.append(rows + a)
            tokens.append(token)
            new_scores.append(cand)
            s.res.n_forward_tokens += len(rows)
        if not parents:
            break

        rows, token = torch.cat(parents), torch.cat(tokens)
        cache.reorder_cache(rows.to(device))           # duplicates parents, drops the rest
        seqs = torch.cat([seqs[rows], token[:, None]], dim=1)
        scores = torch.cat(new_scores)
        marks, owner = marks[rows], owner[rows]
        if scorer is not None:
            chosen_lp = logprobs[rows.to(device)]
            chosen = chosen_lp.gather(1, token[:, None].to(device))
            new_stats = torch.cat([chosen, _token_stats(chosen_lp, conf_topk)], dim=1)
            stats = torch.cat([stats[rows], new_stats.cpu()[:, :, None]], dim=2)
        mask = torch.cat([mask[rows.to(device)], mask.new_ones(len(rows), 1)], dim=1)
        positions = positions[rows.to(device)]
        logits = model(input_ids=token[:, None].to(device), attention_mask=mask,
                       position_ids=positions[:, None], cache=cache,
                       use_cache=True).logits[:, -1, :].float()
        positions = positions + 1

    for s in searches:
        if s.fin_tokens[0] is not None:
            s.res.tokens, s.res.score = s.fin_tokens[0], float(s.fin_scores[0])
    return [s.res for s in searches]


def _step_prompt(s: _Prompt, B: int, logprobs, scores, pruned, seqs, t: int, eos, stops,
                 max_new_tokens: int, length_penalty: float):
    """One step of one prompt's search over its rows (local indices): updates its finished
    hypotheses and returns (parent rows, tokens, summed log-probs) of the beams that run
    on, or None when its search is over."""
    w, device = s.width, scores.device
    # Top 2w continuations over the surviving beams; the flat (beam, token) layout and
    # torch.topk give HF's order, ties included.
    total = (logprobs + scores[:, None]).masked_fill(pruned.to(device)[:, None], -torch.inf)
    V = total.shape[-1]
    k = min(2 * w, int((~pruned).sum()) * V)
    cand_scores, flat = torch.topk(total.flatten(), k)
    parent, token = (flat // V).cpu(), (flat % V).cpu()
    ends = torch.isin(token, eos) | (t + 1 == max_new_tokens)
    if stops is not None:  # like EOS: a candidate past the top w that ends is dropped
        ends |= torch.tensor(stops.hits([seqs[parent[i]].tolist() + [int(token[i])]
                                         for i in range(k)]))

    # Only the top w continuations may finish (HF); lower EOS ones are dropped.
    finishing = ends & (torch.arange(k) < w)
    new = torch.where(finishing.to(device), cand_scores / (t + 1) ** length_penalty, -torch.inf)
    pool = s.fin_tokens + [seqs[parent[i]].tolist() + [int(token[i])] if finishing[i]
                           else None for i in range(k)]
    s.fin_scores, best = torch.topk(torch.cat([s.fin_scores, new]), B)
    s.fin_tokens = [pool[i] for i in best.tolist()]

    run = (~ends).nonzero().squeeze(-1)[:w]
    s.res.alive_per_step.append(len(run))
    if len(run) == 0:
        return None
    # HF's early_stopping=False heuristic: stop once w slots are finished and the best
    # running beam at its current length does not beat the w-th finished one.
    best_running = cand_scores[run.to(device)].max() / (t + 1) ** length_penalty
    if s.fin_tokens[w - 1] is not None and best_running <= s.fin_scores[w - 1]:
        return None
    return parent[run], token[run], cand_scores[run.to(device)]

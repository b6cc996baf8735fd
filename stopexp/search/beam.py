"""Beam search with per-step pruning by a signal (the "delayed verdict" protocol).

Without a scorer this is HF's beam search (`generate(num_beams=B, do_sample=False,
early_stopping=False)`), rewritten on our own cache so that rows can leave it. Each step
takes the top 2B (beam, token) continuations by summed log-prob; EOS continuations among
the top B become finished hypotheses scored sum_logprob / n_generated**length_penalty
(EOS counted); the best B others run on. Any of the model's EOS ids ends a hypothesis, and
so does a token that completes a stop string (stopexp.search.stops: the token is kept). The
search ends at max_new_tokens (where the top B continuations all finish) or once B
hypotheses are finished and the best running beam, divided by its current
length**length_penalty, cannot beat the worst of them.

With a scorer, each step first scores all live beams in one call. Their newest token has
been fed, so the taps hold its hidden state and the features are those a trace bank keeps
at a checkpoint of the same length. A beam the policy refuses is marked; marks count along
a beam's lineage (a continuation inherits its parent's count, a kept beam resets it), and a
beam marked `patience` steps in a row is pruned: it gets no continuations, so the step's 2B
candidates come from the survivors and the pruned beams' slots go to the next best of
them. Pruned rows leave the KV cache at the step's reorder.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from stopexp.search.decode import check_finite
from stopexp.search.stops import StopStrings
from stopexp.signals.columns import signal_matrix


@dataclass
class BeamResult:
    tokens: list[int]             # the best hypothesis' generated tokens (EOS included)
    score: float                  # its sum of log-probs / len**length_penalty
    pruned_steps: list[int] = field(default_factory=list)     # per pruned beam: its length then
    alive_per_step: list[int] = field(default_factory=list)   # beams carried on from each step
    pruned_per_step: list[int] = field(default_factory=list)
    n_forward_tokens: int = 0     # tokens fed through the model, prompt included
    check_calls: int = 0
    check_seconds: float = 0.0


def _feed(model, cache, tokens: torch.Tensor, start: int) -> torch.Tensor:
    """Feed (R, n) tokens at positions start..start+n-1 of an unpadded prompt; last logits."""
    R, n = tokens.shape
    positions = torch.arange(start, start + n, device=tokens.device).expand(R, n)
    mask = torch.ones(R, start + n, dtype=torch.long, device=tokens.device)
    out = model(input_ids=tokens, attention_mask=mask, position_ids=positions, cache=cache,
                use_cache=True)
    return out.logits[:, -1, :].float()


def _token_stats(logprobs: torch.Tensor, conf_topk: int) -> torch.Tensor:
    """(R, 2): entropy and DeepConf confidence of each row's next-token distribution."""
    entropy = -(logprobs.exp() * logprobs.nan_to_num(neginf=0.0)).sum(-1)
    conf = -logprobs.topk(min(conf_topk, logprobs.shape[-1]), dim=-1).values.mean(-1)
    return torch.stack([entropy, conf], -1)


def _features(tokens: torch.Tensor, stats: torch.Tensor, hidden: torch.Tensor,
              window: int, attn: torch.Tensor | None = None) -> dict:
    """The predictor batch (stopexp.signals.features) for the live beams, plus their tokens
    for rule-based scorers; on the model's device, tokens on the CPU. `attn`: (R,)
    attention entropy, None when not tapped."""
    R, t = tokens.shape
    prefix = torch.full((R,), t)
    signals = signal_matrix(stats[:, 0], stats[:, 1], stats[:, 2], prefix, window, hidden, attn)
    return {"hidden": hidden.float(), "signals": signals.to(hidden.device),
            "prefix_len": prefix.float().to(hidden.device), "tokens": tokens}


@torch.no_grad()
def beam_search(model, prompt_ids: list[int], *, beam_width: int, max_new_tokens: int,
                eos_ids, pad_id: int, scorer=None, policy=None, patience: int = 2,
                taps=None, length_penalty: float = 1.0, group_window: int = 8,
                conf_topk: int = 5, check_steps=None, stop=(), tokenizer=None) -> BeamResult:
    """Beam search for one unpadded prompt (so `pad_id` is never needed; it is accepted for
    the same call shape as the engine). `eos_ids`: one id or several (stopexp.search.decode
    .eos_ids). `scorer(batch) -> (R,)` scores the R live beams (higher = better) from the
    batch of `_features`; it needs `policy` and active `taps`. `check_steps` (prefix
    lengths) limits the checks to those steps; None checks every step. `stop`: stop strings,
    checked with `tokenizer`. Raises FloatingPointError on NaN log-probs."""
    if (scorer is None) != (policy is None):
        raise ValueError("beam_search: scorer and policy go together")
    if scorer is not None and taps is None:
        raise ValueError("beam_search: a scorer needs taps (the hidden states it is fed)")
    if not prompt_ids:
        raise ValueError("beam_search: the prompt is empty")
    B, device = beam_width, next(model.parameters()).device
    eos = torch.tensor([eos_ids] if isinstance(eos_ids, int) else list(eos_ids))
    stops = StopStrings(stop, tokenizer) if stop else None
    cache = DynamicCache(config=model.config)
    n_prompt = len(prompt_ids)
    logits = _feed(model, cache, torch.tensor([prompt_ids], device=device), 0)
    res = BeamResult(tokens=[], score=float("-inf"), n_forward_tokens=n_prompt)

    # The live beams, one cache row each. Scores stay float32 on the device, as in HF.
    seqs = torch.zeros(1, 0, dtype=torch.long)         # generated tokens
    scores = torch.zeros(1, device=device)             # summed log-probs
    marks = torch.zeros(1, dtype=torch.long)           # consecutive refusals
    stats = torch.zeros(1, 3, 0)                       # per token: log-prob, entropy, conf
    # Finished hypotheses: B slots sorted best first; None marks an empty slot.
    fin_scores = torch.full((B,), float("-inf"), device=device)
    fin_tokens: list[list[int] | None] = [None] * B

    for t in range(max_new_tokens):                    # t = tokens each live beam holds
        logprobs = torch.log_softmax(logits, dim=-1)
        check_finite(logprobs, t, lambda r: f"beam {r}")
        pruned = torch.zeros(len(seqs), dtype=torch.bool)
        if scorer is not None and t > 0 and (check_steps is None or t in check_steps):
            start = time.perf_counter()
            batch = _features(seqs, stats, taps.read(), group_window,
                              taps.attention_entropy() if taps.attention else None)
            keep = policy.keep(scorer(batch).float().cpu())
            res.check_seconds += time.perf_counter() - start
            res.check_calls += 1
            marks = torch.where(keep, 0, marks + 1)
            pruned = marks >= patience
            res.pruned_steps += [t] * int(pruned.sum())
        res.pruned_per_step.append(int(pruned.sum()))

        # Top 2B continuations over the surviving beams; the flat (beam, token) layout and
        # torch.topk give HF's order, ties included.
        total = (logprobs + scores[:, None]).masked_fill(pruned.to(device)[:, None], -torch.inf)
        V = total.shape[-1]
        k = min(2 * B, int((~pruned).sum()) * V)
        cand_scores, flat = torch.topk(total.flatten(), k)
        parent, token = (flat // V).cpu(), (flat % V).cpu()
        ends = torch.isin(token, eos) | (t + 1 == max_new_tokens)
        if stops is not None:  # like EOS: a candidate past the top B that ends is dropped
            ends |= torch.tensor(stops.hits([seqs[parent[i], -stops.window:].tolist()
                                             + [int(token[i])] for i in range(k)]))

        # Only the top B continuations may finish (HF); lower EOS ones are dropped.
        finishing = ends & (torch.arange(k) < B)
        new = torch.where(finishing.to(device), cand_scores / (t + 1) ** length_penalty,
                          -torch.inf)
        pool = fin_tokens + [seqs[parent[i]].tolist() + [int(token[i])] if finishing[i]
                             else None for i in range(k)]
        merged = torch.cat([fin_scores, new])
        fin_scores, best = torch.topk(merged, B)
        fin_tokens = [pool[i] for i in best.tolist()]

        run = (~ends).nonzero().squeeze(-1)[:B]
        res.alive_per_step.append(len(run))
        if len(run) == 0:
            break
        # HF's early_stopping=False heuristic: stop once all B slots are finished and the
        # best running beam at its current length does not beat the worst finished one.
        best_running = cand_scores[run.to(device)].max() / (t + 1) ** length_penalty
        if None not in fin_tokens and best_running <= fin_scores.min():
            break

        rows = parent[run]
        cache.reorder_cache(rows.to(device))           # duplicates parents, drops the rest
        seqs = torch.cat([seqs[rows], token[run, None]], dim=1)
        scores = cand_scores[run.to(device)]
        marks = marks[rows]
        if scorer is not None:
            parents = logprobs[rows.to(device)]
            chosen = parents.gather(1, token[run, None].to(device))
            new_stats = torch.cat([chosen, _token_stats(parents, conf_topk)], dim=1)
            stats = torch.cat([stats[rows], new_stats.cpu()[:, :, None]], dim=2)
        logits = _feed(model, cache, token[run, None].to(device), n_prompt + t)
        res.n_forward_tokens += len(run)

    if fin_tokens[0] is not None:
        res.tokens, res.score = fin_tokens[0], float(fin_scores[0])
    return res

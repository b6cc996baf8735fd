"""Log-probs of given tokens under the LM, from one teacher-forced forward: what a server
returns as a completion's `logprobs` and scores with `echo` (lm-evaluation-harness'
loglikelihood requests). The model's own distribution: no temperature, penalty or filter,
as vLLM's default logprobs."""
from __future__ import annotations

import torch


@torch.no_grad()
def teacher_forced(model, ids: list[int], start: int, top: int) -> list[tuple[float, list[tuple[int, float]]]]:
    """For each position i in start..len(ids)-1 (start >= 1): log p(ids[i] | ids[:i]) and the
    `top` most likely ids with their log-probs (most likely first)."""
    if not 1 <= start <= len(ids):
        raise ValueError(f"positions from {start} of {len(ids)} ids: the first has no context")
    x = torch.tensor([ids], device=next(model.parameters()).device)
    logits = model(input_ids=x).logits[0, start - 1: len(ids) - 1]
    logp = torch.log_softmax(logits.float(), dim=-1).cpu()
    chosen = logp.gather(-1, torch.tensor(ids[start:])[:, None]).squeeze(-1).tolist()
    if not top:
        return [(c, []) for c in chosen]
    values, index = logp.topk(min(top, logp.shape[-1]), dim=-1)
    return [(c, list(zip(i, v))) for c, i, v in zip(chosen, index.tolist(), values.tolist())]

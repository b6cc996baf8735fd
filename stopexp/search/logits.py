"""vLLM's sampling extras on the hf engine's next-token logits, in vLLM's order: the logit
bias and `min_tokens` (the EOS ids masked until a path holds that many tokens), then the
penalties, and, after the temperature (stopexp.search.decode.sampling_distribution),
`min_p` (transformers' MinPLogitsWarper).

The penalties are vLLM's (vllm.model_executor.layers.utils.apply_penalties): a repetition
penalty r divides a positive logit by r and multiplies a negative one by r for every token
of the prompt or the output; the frequency penalty subtracts f times a token's count in the
output, the presence penalty p once for a token the output holds. Each needs the rows'
token counts, which `Penalties` keeps only when one of them is set."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import MinPLogitsWarper


def penalised(params) -> bool:
    """Whether `params` (SamplingParams) set a penalty (the counts must be kept)."""
    return (params.repetition_penalty != 1.0 or params.presence_penalty != 0.0
            or params.frequency_penalty != 0.0)


@dataclass
class Counts:
    """Per live row: how often each token id occurs in its output, and which ids its prompt
    holds ((B, V) each, on the logits' device)."""
    output: torch.Tensor
    prompt: torch.Tensor

    @classmethod
    def of(cls, prompts: list[list[int]], vocab: int, device) -> "Counts":
        prompt = torch.zeros(len(prompts), vocab, dtype=torch.bool, device=device)
        for r, ids in enumerate(prompts):
            prompt[r, torch.as_tensor(ids, dtype=torch.long, device=device)] = True
        return cls(torch.zeros(len(prompts), vocab, dtype=torch.int32, device=device), prompt)

    def take(self, rows: torch.Tensor) -> "Counts":
        rows = rows.to(self.output.device)
        return Counts(self.output[rows], self.prompt[rows])

    def add(self, tokens: torch.Tensor) -> None:
        self.output[torch.arange(len(tokens), device=tokens.device), tokens] += 1


def adjust_logits(logits: torch.Tensor, params, generated: int, eos_ids: tuple[int, ...],
                  counts: Counts | None) -> torch.Tensor:
    """The logits as vLLM samples from before the temperature: biased, EOS masked under
    min_tokens (`generated`: the tokens each row holds), penalised (`counts` when
    `penalised(params)`)."""
    if not (params.logit_bias or generated < params.min_tokens or counts is not None):
        return logits
    logits = logits.clone()
    if params.logit_bias:
        ids, bias = zip(*params.logit_bias)
        logits[:, list(ids)] += torch.tensor(bias, dtype=logits.dtype, device=logits.device)
    if generated < params.min_tokens:
        logits[:, list(eos_ids)] = float("-inf")
    if counts is not None:
        r = params.repetition_penalty
        if r != 1.0:
            seen = counts.prompt | (counts.output > 0)
            logits = torch.where(seen, torch.where(logits > 0, logits / r, logits * r), logits)
        out = counts.output.to(logits.dtype)
        logits = logits - params.frequency_penalty * out - params.presence_penalty * (out > 0).to(logits.dtype)
    return logits


def min_p_filter(scaled: torch.Tensor, min_p: float) -> torch.Tensor:
    """`scaled` (temperature applied) with the tokens below min_p times the top token's
    probability masked (transformers' warper; the top token always stays)."""
    return MinPLogitsWarper(min_p)(None, scaled) if min_p > 0 else scaled

"""Budget forcing for thinking models (s1, arXiv 2501.19393; model.thinking.max_thinking_tokens,
engine=hf): a path that has generated `budget` tokens and not yet closed its thinking gets
the end tag's tokens as its next tokens, one per step, then samples its answer as usual.

A forced token's log-prob is the one under the unfiltered (temperature-scaled) distribution,
since top-k / top-p may leave it none; its uniform is drawn and unused, so the path's stream
stays aligned. Whether a path has closed its thinking is read from its decoded text, as
stop strings are (stopexp.search.stops), so an end tag the model writes itself counts however
it is tokenised, and the stored text's answer (stopexp.tasks.thinking) starts where it does."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from stopexp.core.errors import ConfigError
from stopexp.core.token_text import text_of
from stopexp.search.stops import StopStrings


@dataclass
class ThinkRows:
    """Per live row of a decode state: its thinking has ended, how many end-tag tokens were
    forced into it so far, its recent tokens (the end tag's text is looked for there)."""
    closed: torch.Tensor  # (B,) bool
    forced: torch.Tensor  # (B,) long
    tails: list[list[int]]

    def take(self, rows) -> "ThinkRows":
        """The rows `rows` (indices, repeats allowed: forks), copied."""
        idx = torch.as_tensor(rows, dtype=torch.long).cpu().reshape(-1)
        return ThinkRows(self.closed[idx].clone(), self.forced[idx].clone(),
                         [list(self.tails[i]) for i in idx.tolist()])


class ThinkingBudget:
    def __init__(self, tokenizer, end_tag: str, budget: int):
        self.end_ids = tokenizer(end_tag, add_special_tokens=False)["input_ids"]
        if end_tag not in text_of(tokenizer, self.end_ids, keep=(end_tag,)):
            raise ConfigError(f"model.thinking.end_tag: {end_tag!r} does not survive decoding (its "
                              "tokens decode to other text), so no path could be seen closing it")
        self.detect, self.budget = StopStrings([end_tag], tokenizer), int(budget)

    def start(self, rows: int) -> ThinkRows:
        return ThinkRows(torch.zeros(rows, dtype=torch.bool), torch.zeros(rows, dtype=torch.long),
                         [[] for _ in range(rows)])

    def apply(self, rows: ThinkRows, t: int, tokens: torch.Tensor, chosen: torch.Tensor,
              full: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Step t's tokens (t generated before it) and their log-probs: as sampled, except
        where a row is still thinking at the budget, which gets the end tag's next token
        (log-prob under `full`, the unfiltered distribution). Updates `rows`."""
        force = (~rows.closed & (t >= self.budget)).to(tokens.device)
        if bool(force.any()):
            ids = torch.tensor(self.end_ids, device=tokens.device)
            tokens = torch.where(force, ids[rows.forced.to(tokens.device).clamp_max(len(ids) - 1)], tokens)
            chosen = torch.where(force, full.gather(-1, tokens[:, None]).squeeze(-1), chosen)
            rows.forced += force.cpu().long()
        rows.tails = [self.detect.trim(tail + [token]) for tail, token in zip(rows.tails, tokens.tolist())]
        rows.closed |= torch.tensor(self.detect.hits(rows.tails)) | (rows.forced >= len(self.end_ids))
        return tokens, chosen

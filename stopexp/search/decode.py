"""The decode engine: batched incremental sampling with a KV cache whose rows really leave.

All live rows advance in lockstep (same number of generated tokens), prompts are
left-padded. A row that ends (any of the model's EOS ids, a stop string, or max length)
or is pruned leaves the batch *and* the cache, so each forward costs only what is still
alive. Logits with NaN stop the run with an error naming the step and the paths.

Every path samples from its own random stream, a function of (seed, prompt, path): the
token at step t is drawn by inverse CDF from the path's t-th uniform. A path's tokens thus
do not depend on which other paths share the batch or were pruned, which is what makes
offline replay of any pruning decision exact.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
import transformers
from transformers import DynamicCache

from stopexp.core.config_text import decode_escapes, stop_strings
from stopexp.core.version import __version__
from stopexp.search.decode_steps import DecodeSteps
from stopexp.search.logits import Counts, adjust_logits, min_p_filter, penalised
from stopexp.search.stops import StopStrings, eos_ids
from stopexp.search.taps import Taps
from stopexp.search.budget_forcing import ThinkingBudget, ThinkRows
from stopexp.signals.confidence import entropy, token_confidence


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    do_sample: bool = True
    conf_topk: int = 5  # DeepConf's token confidence: -mean log-prob of the top-k tokens
    stop: tuple[str, ...] = ()  # stop strings (stopexp.search.stops): a path ends at one
    # a thinking model's budget: then its end tag is forced (stopexp.search.budget_forcing)
    max_thinking_tokens: int | None = None
    think_end: str = "</think>"
    # vLLM's sampling extras (a server's request; stopexp.search.logits)
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 0          # EOS ids and stop strings do not end a path before this
    ignore_eos: bool = False     # an EOS id does not end a path
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)

    @classmethod
    def from_config(cls, search, task, thinking=None) -> "SamplingParams":
        """From the `search` section, the stop strings of it and the `task`
        (stopexp.core.config_text.stop_strings) and a thinking model's budget (model.thinking,
        None: not a thinking model)."""
        think = thinking
        budget = think.max_thinking_tokens if think is not None and think.enabled else None
        return cls(max_new_tokens=search.max_new_tokens, temperature=search.temperature,
                   top_p=search.top_p, top_k=search.top_k, do_sample=search.do_sample,
                   conf_topk=search.conf_topk, stop=stop_strings(task, search),
                   max_thinking_tokens=budget,
                   think_end=decode_escapes(think.end_tag) if budget else "</think>")


def make_engine(model, tokenizer, params: SamplingParams, taps: Taps | None = None,
                checkpoints: tuple[int, ...] = ()) -> "Engine":
    """The engine for `model` with every EOS id, the tokenizer's pad id and, when
    `params.stop` is set, the tokenizer to check stop strings."""
    return Engine(model, eos_ids(model, tokenizer), tokenizer.pad_token_id, params, taps,
                  checkpoints, tokenizer=tokenizer)


def check_finite(logprobs: torch.Tensor, step: int, label: Callable[[int], str]) -> None:
    """Refuse a step whose next-token log-probs hold NaN (NaN or +inf logits, or a row
    whose logits are all -inf): they would be sampled silently as an arbitrary token.
    `label(r)` names row r. Raises FloatingPointError naming the step and the paths."""
    bad = torch.isnan(logprobs).any(-1)
    if bool(bad.any()):
        rows = bad.nonzero().squeeze(-1).tolist()
        names = ", ".join(label(r) for r in rows[:8]) + (" ..." if len(rows) > 8 else "")
        raise FloatingPointError(
            f"decode step {step}: the next-token distribution holds NaN for {len(rows)} of "
            f"{len(bad)} rows ({names}); the model produced NaN or inf logits (as HF's "
            "'probability tensor contains either inf, nan or element < 0'). Try "
            "model.dtype=float32 or a larger search.temperature")


def uniforms(seed: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, generator=g, dtype=torch.float64)


def sampling_distribution(logits: torch.Tensor, p: SamplingParams):
    """log-probs of the sampling distribution (temperature, top-k, top-p applied) and the
    log-probs of the temperature-scaled distribution before filtering."""
    scaled = logits.float() / (p.temperature if p.do_sample else 1.0)
    full = torch.log_softmax(scaled, dim=-1)
    if not p.do_sample:
        return full, full
    filtered = min_p_filter(scaled, p.min_p)
    if p.top_k and p.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, p.top_k, dim=-1).values[..., -1:]
        filtered = filtered.masked_fill(filtered < kth, float("-inf"))
    if p.top_p < 1.0:
        probs = torch.softmax(filtered, dim=-1)
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        # drop a token when the mass before it already reaches top_p; the top token always
        # stays: a tiny top_p (1e-300 is 0 in float32, where 0 >= 0) would drop every token
        drop_sorted = (torch.cumsum(sorted_p, dim=-1) - sorted_p) >= p.top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        filtered = filtered.masked_fill(drop, float("-inf"))
    return torch.log_softmax(filtered, dim=-1), full


def choose_tokens(logp: torch.Tensor, u: torch.Tensor, do_sample: bool) -> torch.Tensor:
    if not do_sample:
        return logp.argmax(dim=-1)
    cdf = torch.cumsum(logp.double().exp(), dim=-1)
    # the first token whose cdf exceeds u * total, never one of zero mass: not one before
    # the first kept token (cdf 0, which u = 0 would reach), nor past the last kept one
    # (where u * total rounds up to the total)
    idx = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1)
    return torch.minimum(idx, (cdf < cdf[:, -1:]).sum(-1))


@dataclass
class StepRecord:
    """What one decode step produced for the rows alive at that step."""
    paths: torch.Tensor      # (B,) path index of each row
    tokens: torch.Tensor     # (B,)
    logprob: torch.Tensor    # (B,) log-prob of the token under the sampling distribution
    entropy: torch.Tensor    # (B,) entropy of the sampling distribution
    conf: torch.Tensor       # (B,) DeepConf token confidence


@dataclass
class Decode:
    """The live state of a batch of paths. Rows are indexed 0..B-1; `paths` maps rows to
    path indices (positions in the list given to `Engine.launch`)."""
    paths: torch.Tensor
    uniforms: torch.Tensor          # (B, max_new_tokens)
    cache: DynamicCache
    attention_mask: torch.Tensor    # (B, T)
    positions: torch.Tensor         # (B,) position id of the next token to feed
    next_logits: torch.Tensor       # (B, V)
    n_generated: int
    n_paths: int
    pool_sum: torch.Tensor | None = None  # (B, layers, H) for mean pooling
    steps: list[StepRecord] = field(default_factory=list)
    features: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    attn: dict[int, torch.Tensor] = field(default_factory=dict)  # checkpoint -> (rows,) entropy
    lengths: torch.Tensor | None = None    # (P,) tokens generated per path so far
    finished: torch.Tensor | None = None   # (P,) ended by EOS or a stop string
    record_taps: bool = True               # forks (Monte Carlo rollouts) keep no features
    labels: list[str] | None = None        # (P,) names of the paths, for error messages
    tails: list[list[int]] | None = None   # (B,) recent tokens of each row, for stop strings
    think: ThinkRows | None = None         # (B,) rows' thinking, under a thinking budget
    counts: Counts | None = None           # (B, V) token counts, under a penalty

    def label(self, row: int) -> str:
        p = int(self.paths[row])
        return self.labels[p] if self.labels else f"path {p}"

    @property
    def size(self) -> int:
        return int(self.paths.numel())

    def select(self, rows: torch.Tensor) -> None:
        """Keep only `rows` (indices into the live batch), in the batch and in the cache."""
        if rows.numel() == self.size and bool((rows.cpu() == torch.arange(self.size)).all()):
            return
        rows = rows.to(self.attention_mask.device)
        self.cache.batch_select_indices(rows)
        self.paths = self.paths[rows.cpu()]
        self.uniforms = self.uniforms[rows.cpu()]
        self.attention_mask = self.attention_mask[rows]
        self.positions = self.positions[rows]
        self.next_logits = self.next_logits[rows]
        if self.pool_sum is not None:
            self.pool_sum = self.pool_sum[rows]
        if self.tails is not None:
            self.tails = [self.tails[r] for r in rows.tolist()]
        if self.think is not None:
            self.think = self.think.take(rows)
        if self.counts is not None:
            self.counts = self.counts.take(rows)

    def keep_paths(self, keep: torch.Tensor) -> None:
        """Keep the live rows whose path index is in `keep`; the others leave."""
        mask = torch.isin(self.paths, keep.cpu())
        self.select(mask.nonzero().squeeze(-1))

    def tensors(self, pad_id: int):
        """(tokens, logprob, entropy, conf) as (P, max_len) padded tensors + lengths."""
        P, T = self.n_paths, max(1, len(self.steps))
        tok = torch.full((P, T), pad_id, dtype=torch.long)
        lp, ent, conf = (torch.zeros(P, T) for _ in range(3))
        for t, s in enumerate(self.steps):
            tok[s.paths, t] = s.tokens
            lp[s.paths, t] = s.logprob
            ent[s.paths, t] = s.entropy
            conf[s.paths, t] = s.conf
        return tok, lp, ent, conf, self.lengths.clone()


class Engine:
    """Runs a frozen causal LM over batches of paths. Taps (forward hooks) are optional:
    with `taps`, hidden features are kept at the `checkpoints` (prefix lengths in generated
    tokens), pooled as the taps say; nothing else of the hidden sequence is kept.
    `eos_id` is one id or several (see `eos_ids`); `tokenizer` is needed for `params.stop`.
    `make_engine` builds one from a model and its tokenizer."""

    def __init__(self, model, eos_id: int | Sequence[int], pad_id: int, params: SamplingParams,
                 taps: Taps | None = None, checkpoints: tuple[int, ...] = (), tokenizer=None):
        self.model, self.pad_id, self.params = model, pad_id, params
        self.eos_ids = (int(eos_id),) if isinstance(eos_id, int) else tuple(map(int, eos_id))
        self.stops = StopStrings(params.stop, tokenizer) if params.stop else None
        self.budget = ThinkingBudget(tokenizer, params.think_end, params.max_thinking_tokens) \
            if params.max_thinking_tokens else None
        self.taps, self.checkpoints = taps, tuple(sorted(set(checkpoints)))
        self.device = next(model.parameters()).device
        bad = [c for c in self.checkpoints if not 1 <= c < params.max_new_tokens]
        if bad:
            raise ValueError(f"checkpoints {bad} lie outside 1..{params.max_new_tokens - 1} "
                             f"(max_new_tokens={params.max_new_tokens})")

    def record(self) -> dict:
        """What the bank's meta.json records about the engine that made it."""
        return {"name": "hf", "version": __version__, "torch": torch.__version__,
                "transformers": transformers.__version__}

    @torch.no_grad()
    def _forward(self, state: Decode, input_ids: torch.Tensor, position_ids: torch.Tensor):
        # logits of the last position only: a prefill's others are never read (as HF generate)
        out = self.model(input_ids=input_ids, attention_mask=state.attention_mask,
                         position_ids=position_ids, cache=state.cache, use_cache=True,
                         logits_to_keep=1)
        state.next_logits = out.logits[:, -1, :].float()

    @torch.no_grad()
    def launch(self, prompts: list[list[int]], seeds: list[int],
               labels: list[str] | None = None) -> Decode:
        """Prefill left-padded `prompts` (token ids, one per path) with their stream seeds;
        `labels` name the paths in error messages (default "path i")."""
        if len(prompts) != len(seeds) or not prompts:
            raise ValueError("launch needs one seed per prompt and at least one prompt")
        if labels is not None and len(labels) != len(prompts):
            raise ValueError("launch needs one label per prompt")
        # the N paths of a prompt share it: encode each distinct prompt once, then copy
        # its cache row N times
        distinct = list(dict.fromkeys(map(tuple, prompts)))
        index = {p: i for i, p in enumerate(distinct)}
        rows = torch.tensor([index[tuple(p)] for p in prompts], device=self.device)
        width = max(map(len, distinct))
        ids = torch.full((len(distinct), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(distinct), width), dtype=torch.long)
        for i, p in enumerate(distinct):
            if p:
                ids[i, width - len(p):] = torch.tensor(p)
                mask[i, width - len(p):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        pos = (mask.cumsum(-1) - 1).clamp_min(0)
        P = len(prompts)
        u = torch.stack([uniforms(s, self.params.max_new_tokens) for s in seeds])
        state = Decode(paths=torch.arange(P), uniforms=u,
                       cache=DynamicCache(config=self.model.config), attention_mask=mask,
                       positions=pos[:, -1] + 1, next_logits=torch.empty(0), n_generated=0,
                       n_paths=P, lengths=torch.zeros(P, dtype=torch.long),
                       finished=torch.zeros(P, dtype=torch.bool), labels=labels,
                       tails=[[] for _ in range(P)] if self.stops else None,
                       think=self.budget.start(P) if self.budget else None)
        self._forward(state, ids, pos)
        if len(distinct) < P:
            state.cache.reorder_cache(rows)
        state.attention_mask, state.positions = mask[rows], state.positions[rows]
        state.next_logits = state.next_logits[rows]
        if penalised(self.params):
            state.counts = Counts.of(prompts, state.next_logits.shape[-1], state.next_logits.device)
        return state

    @torch.no_grad()
    def step(self, state: Decode) -> None:
        """Sample one token for every live row, drop rows that ended, feed the others."""
        p = self.params
        t = state.n_generated
        logits = adjust_logits(state.next_logits, p, t, self.eos_ids, state.counts)
        logp, full = sampling_distribution(logits, p)
        check_finite(logp, t, state.label)
        tokens = choose_tokens(logp, state.uniforms[:, t].to(logp.device), p.do_sample)
        chosen = logp.gather(-1, tokens[:, None]).squeeze(-1)
        if self.budget is not None:
            tokens, chosen = self.budget.apply(state.think, t, tokens, chosen, full)
        # the entropy of the distribution sampled from; the confidence of the unfiltered one
        state.steps.append(StepRecord(state.paths.clone(), tokens.cpu(), chosen.cpu(),
                                      entropy(logp).cpu(),
                                      token_confidence(full, p.conf_topk).cpu()))
        state.n_generated = t + 1
        state.lengths[state.paths] = t + 1
        if state.counts is not None:
            state.counts.add(tokens)
        ended = torch.zeros_like(tokens, dtype=torch.bool) if p.ignore_eos else \
            torch.isin(tokens, torch.tensor(self.eos_ids, device=tokens.device))
        if self.stops is not None:
            state.tails = [self.stops.trim(tail + [token])
                           for tail, token in zip(state.tails, tokens.tolist())]
            hits = self.stops.hits(state.tails)
            if t + 1 > p.min_tokens:
                ended |= torch.tensor(hits, device=tokens.device)
            else:  # as vLLM: a stop string completed before min_tokens ends nothing
                state.tails = [[] if hit else tail for hit, tail in zip(hits, state.tails)]
        state.finished[state.paths[ended.cpu()]] = True
        if t + 1 >= p.max_new_tokens:
            ended = torch.ones_like(ended)
        alive = (~ended).nonzero().squeeze(-1)
        state.select(alive)
        if state.size == 0:
            return
        tokens = tokens[alive]
        state.attention_mask = torch.cat(
            [state.attention_mask, state.attention_mask.new_ones(state.size, 1)], dim=-1)
        if self.taps is not None:
            self.taps.clear()
        self._forward(state, tokens[:, None], state.positions[:, None])
        state.positions = state.positions + 1
        if self.taps is not None and state.record_taps and self.checkpoints \
                and state.n_generated <= self.checkpoints[-1]:  # past the last check: unread
            self._read_taps(state)

    def _read_taps(self, state: Decode) -> None:
        last = self.taps.read()  # (B, layers, H) at the token just fed
        if self.taps.pooling == "mean":
            state.pool_sum = last if state.pool_sum is None else state.pool_sum + last
        n = state.n_generated
        if n in self.checkpoints:
            feats = last if self.taps.pooling == "last" else state.pool_sum / n
            state.features[n] = (state.paths.clone(), feats.float().cpu())
            if self.taps.attention:  # the current token's, whatever the pooling
                state.attn[n] = self.taps.attention_entropy().float().cpu()

    def run(self, state: Decode, until: int | None = None) -> Decode:
        """Advance until every live path has `until` tokens (default: until all end)."""
        limit = self.params.max_new_tokens if until is None else until
        while state.size and state.n_generated < limit:
            self.step(state)
        return state

    def steps(self, max_rows: int = 1024):
        """Its paths as collect and Launch-Check-Resume step them, at most `max_rows` rows
        per forward (stopexp.search.decode_steps.DecodeSteps)."""
        return DecodeSteps(self, max_rows)

    def fork(self, state: Decode, repeats: int, seeds: list[int],
             rows: torch.Tensor | None = None) -> Decode:
        """A new state whose rows are the live `rows` (default: all) each repeated
        `repeats` times, sharing the prefix through a copied cache (no re-encoding): Monte
        Carlo rollouts. New row r*repeats+j draws from `seeds[r*repeats+j]` from the current
        step on. New rows are numbered 0.. in the order of `rows`. The original state is
        untouched."""
        rows = torch.arange(state.size) if rows is None else rows
        if len(seeds) != len(rows) * repeats:
            raise ValueError("fork needs one seed per new row")
        idx = rows.to(state.attention_mask.device).repeat_interleave(repeats)
        cache = DynamicCache(config=self.model.config)
        for i, layer in enumerate(state.cache.layers):
            cache.update(layer.keys[idx], layer.values[idx], i)
            if hasattr(layer, "cumulative_length"):  # a sliding-window layer holds its window
                # only; its masks count every position it has seen
                cache.layers[i].cumulative_length = layer.cumulative_length
        P = len(idx)
        t = state.n_generated
        u = torch.zeros(P, self.params.max_new_tokens, dtype=torch.float64)
        for r, s in enumerate(seeds):
            u[r, t:] = uniforms(s, self.params.max_new_tokens - t)
        parents = idx.cpu().tolist()
        labels = [f"{state.label(r)} rollout {k % repeats}" for k, r in enumerate(parents)]
        tails = None if state.tails is None else [list(state.tails[r]) for r in parents]
        return Decode(paths=torch.arange(P), uniforms=u, cache=cache,
                      attention_mask=state.attention_mask[idx], positions=state.positions[idx],
                      next_logits=state.next_logits[idx], n_generated=t, n_paths=P,
                      pool_sum=None, lengths=torch.full((P,), t, dtype=torch.long),
                      finished=torch.zeros(P, dtype=torch.bool), record_taps=False,
                      labels=labels, tails=tails, think=state.think and state.think.take(idx),
                      counts=state.counts and state.counts.take(idx))

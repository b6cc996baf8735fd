"""The super-token predictor (the published STOP design, arXiv 2604.16029).

`n_tokens` [STOP] tokens, all one learnable embedding, are appended to a path's cached
prefix and run through the frozen LM with a LoRA adapter; the last layer's hidden state
(after the final norm) at the last [STOP] goes through a linear head to one logit.

[STOP] has no token id: it is fed as `inputs_embeds`, so the tokenizer and the embedding
matrix are untouched and no existing id or output can change. The adapter is injected
into the LM but switched off except inside the scoring call, which only ever feeds the
[STOP] positions (the prefix K/V come from the cache, computed without it; [STOP] attends
to them as constants, stopexp.models.stop_attention). Scoring
appends to the cache and crops it back, so a live path continues as if never checked
(a sliding-window layer records its past for the call, so that it can be cropped).

The batch gives the prefixes either as the live decode state ("lm_state", online) or as
"prompt" + "tokens" + "prefix_len" (replay, training), which are encoded without LoRA;
training keeps their K/V across epochs (`keep_prefixes`, stopexp.models.prefix_cache).
An LM with sliding-window layers encodes each prefix as one left-padded row in a cache that
keeps every position: its masks count the window in cache columns, which a prompt shared by
rows with right-padded generated parts would shift.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch
from peft import LoraConfig, inject_adapter_in_model
from peft.tuners.tuners_utils import BaseTunerLayer
from torch import nn
from transformers import DynamicCache

from stopexp.models.extract import DEFAULT_BATCH_TOKENS, plan_batches
from stopexp.models.prefix_cache import PrefixCache
from stopexp.models.stop_attention import stop_attention
from stopexp.search.sample import prompt_ids
from stopexp.signals.saved_predictor import (REBUILD, CheckpointMismatch, check_spec, check_trained_on,
                                        load_weights, read_checkpoint)
from stopexp.signals.feature_spec import FeatureSpec

ADAPTER = "stop"


class SuperTokenPredictor(nn.Module):
    def __init__(self, predictor, lm, tokenizer, max_rows: int = 256):
        super().__init__()
        if any(isinstance(m, BaseTunerLayer) for m in lm.modules()):
            raise ValueError("the LM already carries an adapter; give the super token its own LM")
        # not a submodule: the frozen LM stays out of state_dict(), .train() and .to()
        object.__setattr__(self, "lm", lm)
        self.tokenizer, self.n_tokens, self.max_rows = tokenizer, predictor.n_tokens, max_rows
        self.prefixes: PrefixCache | None = None
        inject_adapter_in_model(LoraConfig(r=predictor.lora_rank, lora_alpha=predictor.lora_alpha,
                                           target_modules=list(predictor.lora_targets),
                                           lora_dropout=float(getattr(predictor, "lora_dropout", 0.0))),
                                lm, adapter_name=ADAPTER)
        self._layers = [m for m in lm.modules() if isinstance(m, BaseTunerLayer)]
        # the adapter's dropout sits in the LM, which is no submodule: train() switches it
        self._dropouts = [m.lora_dropout[ADAPTER] for m in self._layers]
        # registered here (shared with the LM) so the optimizer and state_dict() see them
        self.lora = nn.ParameterDict({n.replace(".", "__"): p for n, p in lm.named_parameters()
                                      if "lora_" in n})
        self._set_adapter(False)
        self.sliding = any(getattr(layer, "is_sliding", False)
                           for layer in DynamicCache(config=lm.config).layers)
        emb = lm.get_input_embeddings().weight
        self.stop = nn.Parameter(emb.detach().float().mean(0))  # a neutral, in-distribution start
        self.head = nn.Linear(emb.shape[1], 1, device=emb.device)

    def train(self, mode: bool = True):
        """Training mode for the head and the adapter's dropout (the frozen LM stays as it is)."""
        super().train(mode)
        for dropout in self._dropouts:
            dropout.train(mode)
        return self

    def keep_prefixes(self, budget_gb: float, free_gib=None, reserve_gb: float = 0.0) -> None:
        """Keep the replayed prefixes' K/V (LoRA-free, so fixed while the adapter trains)
        across calls, up to `budget_gb` GiB and never below `reserve_gb` of `free_gib()` (the
        memory free now); 0 encodes every prefix at every call."""
        self.prefixes = PrefixCache(budget_gb, free_gib, reserve_gb) if budget_gb > 0 else None

    def empty_cache(self) -> DynamicCache:
        """The cache replayed prefixes are encoded into: every position in every layer where
        the LM has sliding-window layers (the masks still apply the window), the LM's own
        cache otherwise."""
        return DynamicCache() if self.sliding else DynamicCache(config=self.lm.config)

    def _set_adapter(self, on: bool) -> None:
        for m in self._layers:
            m.enable_adapters(on)
        for p in self.lora.values():  # peft ties requires_grad to the switch; backward runs after it
            p.requires_grad_(True)

    @contextmanager
    def _adapter(self):
        self._set_adapter(True)
        try:
            yield
        finally:
            self._set_adapter(False)

    def score_cache(self, cache, attention_mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """(B,) logits for the prefixes held in `cache` (left-padded, `positions` = next
        position id per row); the cache is cropped back to the prefix afterwards."""
        B, n = attention_mask.shape[0], self.n_tokens
        dtype = self.lm.get_input_embeddings().weight.dtype
        length = cache.get_seq_length()
        sliding = [layer for layer in cache.layers if getattr(layer, "is_sliding", False)]
        recording = [layer.record_past for layer in sliding]
        for layer in sliding:  # else past its window a layer drops what crop would restore
            layer.activate_past_recording()
        try:
            with self._adapter(), stop_attention(self.lm):
                hidden = self.lm.get_decoder()(
                    inputs_embeds=self.stop.to(dtype).expand(B, n, -1),
                    attention_mask=torch.cat([attention_mask, attention_mask.new_ones(B, n)], -1),
                    position_ids=positions[:, None] + torch.arange(n, device=positions.device),
                    cache=cache, use_cache=True).last_hidden_state
        finally:
            for layer in cache.layers:  # per layer: a failed forward may stop half-way
                extra = layer.get_seq_length() - length
                if extra > 0:
                    layer.crop(-extra)
            for layer, record in zip(sliding, recording):
                layer.record_past = record
        return self.head(hidden[:, -1].float()).squeeze(-1)

    @torch.no_grad()
    def encode(self, prefixes: list[list[int]], prompt_lens: list[int] | None = None):
        """(cache, attention mask, next positions) of `prefixes` (prompt + generated ids),
        LoRA off. Rows whose first `prompt_lens` ids are one prompt share its prefill, as
        featurize does (stopexp.models.extract): the prompts left-padded, each row's
        generated ids after its prompt's cache rows, right-padded and masked, so [STOP]
        attends to the prefix only; positions count the unpadded prefix. On a sliding-window
        LM every row is its own prompt (`prompt_lens` unused: the module's doc)."""
        lens = ([len(p) for p in prefixes] if prompt_lens is None or self.sliding else prompt_lens)
        device, pad = self.stop.device, self.tokenizer.pad_token_id
        units: dict[tuple, int] = {}
        unit = [units.setdefault(tuple(p[:n]), len(units)) for p, n in zip(prefixes, lens)]
        prompts = list(units)
        width = max(map(len, prompts))
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for u, p in enumerate(prompts):
            ids[u, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[u, width - len(p):] = 1
        ids, mask = ids.to(device), mask.to(device)
        pos = (mask.cumsum(-1) - 1).clamp_min(0)  # as Engine.launch numbers them
        cache = self.empty_cache()
        decoder = self.lm.get_decoder()
        decoder(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
        rows = torch.tensor(unit, device=device)
        cache.reorder_cache(rows)
        gens = [p[n:] for p, n in zip(prefixes, lens)]
        G = max(map(len, gens))
        gen = torch.full((len(gens), G), pad, dtype=torch.long)
        gen_mask = torch.zeros((len(gens), G), dtype=torch.long)
        for r, g in enumerate(gens):
            gen[r, :len(g)] = torch.tensor(g, dtype=torch.long)
            gen_mask[r, :len(g)] = 1
        full = torch.cat([mask[rows], gen_mask.to(device)], -1)
        start = pos[rows, -1] + 1
        if G:
            decoder(input_ids=gen.to(device), attention_mask=full, position_ids=start[:, None] +
                    torch.arange(G, device=device), cache=cache, use_cache=True)
        return cache, full, start + gen_mask.sum(-1).to(device)

    def forward(self, batch: dict) -> torch.Tensor:
        state = batch.get("lm_state")
        if state is not None:  # online: the live rows, in the batch's order
            return self.score_cache(state.cache, state.attention_mask, state.positions)
        if "prompt" not in batch:
            raise ValueError("super_token scores from the live decode state ('lm_state') or from "
                             "the prefixes ('prompt', 'tokens', 'prefix_len'); the batch has neither")
        if not len(batch["prompt"]):
            return torch.zeros(0, device=self.stop.device)
        ids = {p: prompt_ids(self.tokenizer, p) for p in set(batch["prompt"])}
        sequences = [(ids[p], [int(t) for t in tok[: int(n)]], [int(n)])
                     for p, tok, n in zip(batch["prompt"], batch["tokens"], batch["prefix_len"])]
        if self.sliding:  # each prefix one row of its own (the module's doc)
            sequences = [(prompt + gen, [], [0]) for prompt, gen, _ in sequences]
        parts, order = [], []
        for units in plan_batches(sequences, DEFAULT_BATCH_TOKENS, self.max_rows):
            rows = [i for _, idx in units for i in idx]
            keys = {i: (tuple(sequences[i][0]), tuple(sequences[i][1])) for i in rows}
            kept = [i for i in rows if keys[i] in self.prefixes] if self.prefixes is not None else []
            if kept:
                parts.append(self.score_cache(*self.prefixes.assemble([keys[i] for i in kept],
                                                                      self.empty_cache())))
                order += kept
            hit = set(kept)
            rows = [i for i in rows if i not in hit]  # to encode (and keep)
            if rows:
                encoded = self.encode([sequences[i][0] + sequences[i][1] for i in rows],
                                      [len(sequences[i][0]) for i in rows])
                if self.prefixes is not None:
                    self.prefixes.store([keys[i] for i in rows], encoded[0], encoded[1])
                parts.append(self.score_cache(*encoded))
                order += rows
        back = torch.empty(len(order), dtype=torch.long)
        back[torch.tensor(order)] = torch.arange(len(order))
        return torch.cat(parts)[back.to(self.stop.device)]


def checkpoint_meta(ckpt_dir: Path, spec: FeatureSpec, pred_cfg, trained_on: dict | None = None) -> dict:
    """The checkpoint's metadata, its files checked and refused for another model, another
    predictor config than `pred_cfg` or other data than `trained_on` (no LM needed);
    CheckpointDamaged / CheckpointMismatch name the file or field."""
    meta = read_checkpoint(ckpt_dir, pred_cfg)
    check_spec(meta["feature_spec"], spec, ckpt_dir)
    check_trained_on(meta, trained_on, ckpt_dir)
    return meta


def load_super_token(ckpt_dir: Path, lm, tokenizer, spec: FeatureSpec, pred_cfg,
                     max_rows: int = 256, trained_on: dict | None = None):
    """(predictor in eval mode, metadata) on `lm`; refused for another model, predictor
    config than `pred_cfg` or data than `trained_on`, naming the field."""
    from omegaconf import OmegaConf

    meta = checkpoint_meta(ckpt_dir, spec, pred_cfg, trained_on)
    hidden = lm.get_input_embeddings().weight.shape[1]
    if hidden != meta["feature_spec"]["hidden_size"]:
        raise CheckpointMismatch(f"super-token checkpoint {ckpt_dir} was trained for hidden_size="
                                 f"{meta['feature_spec']['hidden_size']}, but the LM has hidden_size={hidden}; "
                                 + REBUILD.format(dir=ckpt_dir))
    predictor = SuperTokenPredictor(OmegaConf.create(meta["predictor"]), lm, tokenizer, max_rows)
    state = load_weights(ckpt_dir, device=str(predictor.stop.device))
    differ = set(predictor.state_dict()) ^ set(state)
    if differ:
        raise CheckpointMismatch(f"super-token checkpoint {ckpt_dir} has other adapter layers than "
                                 f"this LM (num_layers or lora_targets differ): {sorted(differ)[:3]}; "
                                 + REBUILD.format(dir=ckpt_dir))
    predictor.load_state_dict(state)
    return predictor.eval(), meta


SuperTokenPredictor.from_checkpoint = staticmethod(load_super_token)  # what train saved

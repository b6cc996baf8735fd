"""Teacher-forced extraction: the tapped hidden states of stored paths at chosen positions,
by one forward over each path's tokens (the features artifact, `stopexp.store.feature_sets`,
is made of them).

A causal LM's hidden state at a position depends only on the tokens up to it, so one
forward over prompt + generated tokens yields every position of a path at once. The
feature at position c (generated tokens) is the tapped state of the token that fed
generated token c, i.e. sequence position prompt_len + c - 1, exactly what the decode
engine's taps read there (`stopexp.search.decode`); pooling `mean` averages generated
tokens 1..c. Paths are batched as the engine batches them (left-padded prompts, position
ids from the mask cumsum), so the values match the decode-time taps to float tolerance.
"""
from __future__ import annotations

import numpy as np
import torch

from stopexp.search.taps import decoder_layers

DEFAULT_BATCH_TOKENS = 16384  # tokens per teacher-forced forward without model.max_batch_tokens


def path_positions(tokens, spec: dict, step_end: dict[int, bool]) -> list[int]:
    """A path's feature positions: those of `spec` where it is alive (1 <= c < length).
    `step_end` maps token ids to whether they end a step (filled as tokens are seen)."""
    n = len(tokens)
    out = {c for c in spec["checkpoints"] if c < n}
    if spec["stride"]:
        out.update(range(spec["stride"], n, spec["stride"]))
    if spec["separator"] is not None:
        out.update(c for c in range(1, n) if step_end[int(tokens[c - 1])])
    return sorted(out)


def position_filter(spec: dict, step_end: dict[int, bool]):
    """`wanted(tokens)`: for a path whose generated ids are (or will be, in place) `tokens`,
    whether position c is one of `spec`'s, given that it is alive there (`path_positions`
    keeps exactly these); for taps that read positions while the path is generated."""
    checkpoints, stride, separator = set(spec["checkpoints"]), spec["stride"], spec["separator"]

    def wanted(tokens):
        return lambda c: (c in checkpoints or bool(stride and c % stride == 0)
                          or (separator is not None and step_end[int(tokens[c - 1])]))
    return wanted


class StepEnds(dict):
    """token id -> whether its text holds the step separator, decoded on first use."""

    def __init__(self, tokenizer, separator: str | None):
        super().__init__()
        self.tokenizer, self.separator = tokenizer, separator

    def __missing__(self, token: int) -> bool:
        self[token] = self.separator in self.tokenizer.decode([token])
        return self[token]


class _Enough(Exception):
    """Raised by a hook after the deepest layer a forward needs: the rest is not computed."""


def plan_batches(sequences, batch_tokens: int, max_rows: int) -> list[list[tuple[tuple, list[int]]]]:
    """Batches of (prompt, path indices) units: the paths of one prompt share one prefill,
    and a batch holds at most `max_rows` paths and `batch_tokens` padded tokens."""
    groups: dict[tuple, list[int]] = {}
    for i, (prompt, _, pos) in enumerate(sequences):
        if pos:
            groups.setdefault(tuple(prompt), []).append(i)
    units = []
    for prompt, idx in groups.items():
        idx.sort(key=lambda i: sequences[i][2][-1])
        chunk: list[int] = []
        for i in idx:
            width = len(prompt) + sequences[i][2][-1]
            if chunk and ((len(chunk) + 1) * width > batch_tokens or len(chunk) >= max_rows):
                units.append((prompt, chunk))
                chunk = []
            chunk.append(i)
        units.append((prompt, chunk))
    units.sort(key=lambda u: (len(u[0]), sequences[u[1][-1]][2][-1]))
    batches, batch, rows, prompt_w, gen_w = [], [], 0, 0, 0
    for prompt, idx in units:
        p_w, g_w = max(prompt_w, len(prompt)), max(gen_w, sequences[idx[-1]][2][-1])
        if batch and (rows + len(idx) > max_rows or (rows + len(idx)) * (p_w + g_w) > batch_tokens):
            batches.append(batch)
            batch, rows, p_w, g_w = [], 0, len(prompt), sequences[idx[-1]][2][-1]
        batch.append((prompt, idx))
        rows, prompt_w, gen_w = rows + len(idx), p_w, g_w
    return batches + ([batch] if batch else [])


def shared_prefixes(sequences) -> tuple[dict[int, list[int]], list[int]]:
    """Which paths to run so that every (path, position) is computed once: a causal LM's
    state at a position depends only on the prefix, and sampled paths of one prompt often
    share long prefixes. Returns {path run: the positions wanted from it} and, per path,
    the path whose run holds its positions (itself, or one whose tokens extend its prefix
    up to its last position). Paths without positions map to -1."""
    tries: dict[tuple, dict] = {}
    ends = [None] * len(sequences)
    for i, (prompt, gen, pos) in enumerate(sequences):
        if not pos:
            continue
        node = tries.setdefault(tuple(prompt), {})
        for t in gen[: pos[-1]]:
            node = node.setdefault(int(t), {})
        node.setdefault(None, i)  # the first path ending here owns the node
        ends[i] = node
    owner, wanted = [-1] * len(sequences), {}
    for i, node in enumerate(ends):
        if node is None:
            continue
        while len(node) > 1 or None not in node:  # down to a leaf: the end of a longest path
            node = next(v for k, v in node.items() if k is not None)
        owner[i] = node[None]
        wanted.setdefault(owner[i], set()).update(sequences[i][2])
    return {o: sorted(p) for o, p in wanted.items()}, owner


@torch.no_grad()
def extract(model, taps, sequences: list[tuple[list[int], list[int], list[int]]], pad_id: int,
            batch_tokens: int = DEFAULT_BATCH_TOKENS, max_rows: int = 1024
            ) -> list[tuple[np.ndarray, np.ndarray | None]]:
    """Teacher-forced features of paths given as (prompt ids, generated ids, positions):
    per path a (len(positions), layers, H) float32 array and, when `taps` reads attention,
    (len(positions),) entropies (else None); a path without positions gets (0, layers, 0).
    A prefix shared by several paths of a prompt is computed once (`shared_prefixes`)."""
    wanted, owner = shared_prefixes(sequences)
    runs = [(sequences[i][0], sequences[i][1], wanted.get(i, [])) for i in range(len(sequences))]
    got = _extract_runs(model, taps, runs, pad_id, batch_tokens, max_rows)
    out = []
    for i, (_, _, pos) in enumerate(sequences):
        if owner[i] < 0:
            out.append((np.zeros((0, len(taps.layers), 0), np.float32), None))
            continue
        hidden, attn = got[owner[i]]
        rows = np.searchsorted(wanted[owner[i]], pos)
        out.append((hidden[rows], None if attn is None else attn[rows]))
    return out


def prefix_features(model, taps, pad_id: int, dtype: str, batch_tokens: int = DEFAULT_BATCH_TOKENS,
                    max_rows: int = 1024):
    """`hidden_at(sequences)` for online checks outside the decode loop: the (B, layers, H)
    features and the (B,) attention entropies (None without the attention tap) of (prompt
    ids, prefix ids, [check]) triples, stored as featurize stores them (tap.positions.dtype),
    so a check scores what replay of the features scores."""
    def hidden_at(sequences):
        got = extract(model, taps, sequences, pad_id, batch_tokens, max_rows)
        hidden = np.concatenate([h for h, _ in got]).astype(dtype).astype(np.float32)
        attn = None if got[0][1] is None else np.concatenate([a for _, a in got])
        return torch.from_numpy(hidden), None if attn is None else torch.from_numpy(attn)
    return hidden_at


@torch.no_grad()
def _extract_runs(model, taps, sequences, pad_id: int, batch_tokens: int, max_rows: int) -> list:
    """`extract` without the prefix sharing: every path with positions is run.

    As the engine does, each distinct prompt of a batch is prefilled once (left-padded,
    position ids from the mask cumsum), its cache rows copied to its paths, then the
    generated tokens up to each path's last position are fed in one forward (right-padded:
    a causal LM's earlier positions never see them). `taps` must be a `Taps(...,
    sequence=True)` whose hooks are active; layers deeper than the deepest tap are not
    computed, nor the logits. Batches hold at most `batch_tokens` padded tokens and
    `max_rows` paths."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    out: list = [(np.zeros((0, len(taps.layers), 0), np.float32), None)] * len(sequences)
    deepest = max([*taps.layers, *(layer for layer, _ in taps.heads)])

    def stop(module, args, output):
        raise _Enough

    def forward(**kwargs):
        try:
            model(**kwargs, use_cache=True, logits_to_keep=1)
        except _Enough:
            pass

    handle = decoder_layers(model)[deepest].register_forward_hook(stop)  # after the taps' hooks
    try:
        for batch in plan_batches(sequences, batch_tokens, max_rows):
            width = max(len(p) for p, _ in batch)
            ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for u, (prompt, _) in enumerate(batch):
                if prompt:
                    ids[u, width - len(prompt):] = torch.tensor(prompt)
                    mask[u, width - len(prompt):] = 1
            ids, mask = ids.to(device), mask.to(device)
            pos = (mask.cumsum(-1) - 1).clamp_min(0)
            cache = DynamicCache(config=model.config)
            forward(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache)
            paths = [i for _, idx in batch for i in idx]
            unit = torch.tensor([u for u, (_, idx) in enumerate(batch) for _ in idx], device=device)
            cache.reorder_cache(unit)
            G = max(sequences[i][2][-1] for i in paths)
            gen = torch.full((len(paths), G), pad_id, dtype=torch.long)
            for r, i in enumerate(paths):
                tokens = list(sequences[i][1][:G])
                gen[r, :len(tokens)] = torch.tensor(tokens)
            gen_mask = torch.cat([mask[unit], mask.new_ones(len(paths), G)], dim=1)
            gen_pos = pos[unit, -1:] + 1 + torch.arange(G, device=device)
            taps.clear()
            forward(input_ids=gen.to(device), attention_mask=gen_mask, position_ids=gen_pos,
                    cache=cache)
            hidden = taps.read()                                         # (B, G, layers, H)
            attn = taps.attention_entropy() if taps.attention else None  # (B, G)
            for r, i in enumerate(paths):
                p = sequences[i][2]
                at = torch.as_tensor(p, device=device) - 1  # feeds generated token c at c - 1
                if taps.pooling == "mean":  # generated tokens 1..c, summed in order as decode does
                    seg = hidden[r, : p[-1]].cumsum(0)
                    feats = seg[at] / (at + 1).to(seg.dtype)[:, None, None]
                else:
                    feats = hidden[r, at]
                ent = None if attn is None else attn[r, at].float().cpu().numpy()
                out[i] = (feats.float().cpu().numpy(), ent)
    finally:
        handle.remove()
    return out

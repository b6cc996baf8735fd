"""stopexp's decode engine (stopexp.search.decode) stepped as stopexp.search.stepping's
`Stepper`: the paths of a chunk of prompts are one left-padded batch (a prompt is prefilled
once and its cache copied to its N paths), stepped in lockstep; an abort drops the rows
from the batch and the cache, and Monte Carlo rollouts fork the live rows' cache (no
re-encoding). The check's states are the engine's taps at its checkpoints; super_token
scores from the live cache."""
from __future__ import annotations

import torch

from stopexp.search.stepping import Running, prompt_chunks


class DecodeSteps:
    """The hf engine as Launch-Check-Resume steps it: whole prompts per chunk, as many as
    fit into `max_rows` paths (stopexp.search.sample.row_cap; at least one prompt). The
    engine's taps record the states at the checks (its `checkpoints`)."""

    def __init__(self, engine, max_rows: int = 1024):
        self.engine, self.max_rows = engine, max_rows

    def start(self, paths: list[Running], meter=None, labels=None) -> "DecodeStepper":
        return DecodeStepper(self.engine, paths, meter, labels, self.max_rows)

    def chunks(self, n_prompts: int, n_paths: int) -> list[range]:
        return list(prompt_chunks(n_prompts, n_paths, self.max_rows))


class DecodeStepper:
    """`paths` launched as one batch of the engine (path p is row p of the launch); its
    rollouts run at most `max_rows` rows per forward."""

    def __init__(self, engine, paths: list[Running], meter=None, labels=None,
                 max_rows: int = 1024):
        self.engine, self.paths, self.meter, self.max_rows = engine, paths, meter, max_rows
        self.state = engine.launch([p.prompt for p in paths], [p.seed for p in paths], labels)
        self.index = {id(p): n for n, p in enumerate(paths)}
        self.observe()

    @property
    def running(self) -> bool:
        return self.state.size > 0

    def observe(self) -> None:
        if self.meter is not None and self.state.size:
            self.meter.observe(self.state.positions,
                               [self.paths[n].key[0] for n in self.state.paths.tolist()])

    def step(self) -> None:
        self.engine.step(self.state)
        record, alive = self.state.steps[-1], set(self.state.paths.tolist())
        for n, token in zip(record.paths.tolist(), record.tokens.tolist()):
            p = self.paths[n]
            p.tokens.append(token)
            if n not in alive:
                p.finished = True
                p.finish_reason = "stop" if bool(self.state.finished[n]) else "length"

    def abort(self, paths: list[Running]) -> None:
        gone = {self.index[id(p)] for p in paths}
        for p in paths:
            p.pruned = True
        self.state.keep_paths(torch.tensor([n for n in self.state.paths.tolist() if n not in gone],
                                           dtype=torch.long))

    def _rows(self, paths: list[Running]) -> torch.Tensor:
        return torch.tensor([self.index[id(p)] for p in paths], dtype=torch.long)

    def columns(self, paths: list[Running], upto: int | None = None) -> list[tuple]:
        _, lp, ent, conf, _ = self.state.tensors(self.engine.pad_id)
        return [tuple(x[n, : len(p.tokens) if upto is None else upto].numpy() for x in (lp, ent, conf))
                for n, p in zip(self._rows(paths).tolist(), paths)]

    def rollouts(self, paths: list[Running], check: int, seeds: list[int], repeats: int,
                 logprobs: bool = False) -> list[list[tuple]]:
        s = self.state
        if s.n_generated != check:
            raise RuntimeError(f"rollouts from prefix {check}: the batch holds {s.n_generated} "
                               "tokens per path (its live rows are forked in lockstep)")
        live = {n: r for r, n in enumerate(s.paths.tolist())}
        rows = [live[n] for n in self._rows(paths).tolist()]  # KeyError: a path not live
        done, per = [], max(1, self.max_rows // repeats)
        for lo in range(0, len(rows), per):
            part = torch.tensor(rows[lo:lo + per], dtype=torch.long)
            child = self.engine.run(self.engine.fork(s, repeats, seeds[lo * repeats:(lo + len(part)) * repeats], part))
            tok, lp, *_, n = child.tensors(self.engine.pad_id)
            done += [(tok[k, : n[k] - check].tolist(), lp[k, : n[k] - check].numpy() if logprobs else None)
                     for k in range(len(part) * repeats)]
        return [done[k * repeats:(k + 1) * repeats] for k in range(len(paths))]

    def inputs(self, paths: list[Running], check: int) -> tuple:
        if check not in self.state.features:
            raise ValueError(f"the engine recorded no taps at prefix {check}: build it with "
                             f"that checkpoint (its checkpoints: {self.engine.checkpoints})")
        idx = self._rows(paths)
        recorded, hidden = self.state.features[check]
        row_of = torch.full((self.state.n_paths,), -1, dtype=torch.long)
        row_of[recorded] = torch.arange(len(recorded))
        rows = row_of[idx]
        if bool((rows < 0).any()):  # in lockstep every checked path was live at the check
            raise RuntimeError(f"paths checked at prefix {check} have no state recorded there")
        attn = self.state.attn.get(check)
        _, lp, ent, conf, _ = self.state.tensors(self.engine.pad_id)
        return (hidden[rows], None if attn is None else attn[rows],
                lp[idx, :check], ent[idx, :check], conf[idx, :check])

    def lm_state(self, paths: list[Running]):
        # in lockstep the live rows are the checked paths, in launch order
        if self._rows(paths).tolist() == self.state.paths.tolist():
            return self.state
        return None

"""engine=vllm: vLLM (stopexp.search.vllm_engine), one request per path. With engine.taps
its hidden states are tapped inside the engine while it generates (stopexp.search.vllm_taps):
collect writes the features with the bank and online checks load no second model; without
(engine.taps=false, or a tap with attention heads) the HF model's teacher-forced forward
reads them. Monte Carlo rollouts are new requests from the prefix; online
Launch-Check-Resume steps an in-process engine (stopexp.search.vllm_steps) in the one loop
of stopexp.search.lcr, and aborts pruned requests."""
from __future__ import annotations

from contextlib import contextmanager

from stopexp.engines import Sections
from stopexp.models import load_lm
from stopexp.models.extract import DEFAULT_BATCH_TOKENS, prefix_features
from stopexp.models.vllm_lm import model_skeleton, open_vllm_engine
from stopexp.search.taps import Taps
from stopexp.search.inpath import run_in_path
from stopexp.search.lcr import launch_check_resume
from stopexp.search.vllm_steps import VllmSteps


class VLLM:
    name = "vllm"

    def taps_in_engine(self, engine, tap) -> bool:
        # vLLM's attention kernels return no weights: attention entropy is read teacher-forced
        return bool(engine.get("taps")) and not tap.get("attention_heads")

    def open(self, model, engine, cache_dir, task, params, tap=None, positions=None):
        return open_vllm_engine(model, engine, cache_dir, task, params, tap=tap, positions=positions)

    def load(self, model, engine, cache_dir, task, tap, progress):
        if self.taps_in_engine(engine, tap):  # its weightless skeleton: sizes, EOS ids
            return model_skeleton(model, engine, cache_dir, task)[:2]
        return load_lm(model, cache_dir, task, tap, progress)

    def online(self, lm, tokenizer, task, problems, methods, checkpoint, *, sections: Sections,
               params, max_rows):
        s = sections
        search = s.search
        run = dict(tokenizer=tokenizer, task=task, problems=problems, n_paths=search.n_paths,
                   seed=s.seed, checkpoint=checkpoint, methods=methods,
                   group_window=search.group_window, score_rule=search.score_rule)
        checks = [checkpoint] if isinstance(checkpoint, int) else sorted(checkpoint)
        with self._steps(lm, tokenizer, s, params, checks) as steps:
            return launch_check_resume(steps, **run)

    @contextmanager
    def serve(self, lm, tokenizer, *, sections: Sections, params, checks, max_rows):
        with self._steps(lm, tokenizer, sections, params, sorted(checks)) as steps:
            yield steps.open()

    @contextmanager
    def _steps(self, lm, tokenizer, s: Sections, params, checks: list[int]):
        """The in-process engine stepped, its check's states at `checks` tapped inside it,
        or without taps read by the HF model `lm` (teacher-forced)."""
        tap = s.tap
        opened = dict(model=s.model, engine=s.engine, cache_dir=s.cache_dir, task=s.task,
                      params=params, in_process=True)
        if self.taps_in_engine(s.engine, tap):
            with open_vllm_engine(**opened, tap=tap, positions={
                    "checkpoints": checks, "stride": None, "separator": None}) as (engine, *_):
                yield VllmSteps(engine)
            return
        with Taps(lm, list(tap.layers), tap.pooling, tap.get("attention_heads"),
                  sequence=True) as taps, open_vllm_engine(**opened) as (engine, *_):
            hidden_at = prefix_features(lm, taps, tokenizer.pad_token_id, tap.positions.dtype,
                                        s.model.max_batch_tokens or DEFAULT_BATCH_TOKENS,
                                        s.search.max_batch_rows)
            yield VllmSteps(engine, hidden_at)

    def stopping(self, lm, tokenizer, task, problems, controllers, *, sections: Sections,
                 params, max_rows):
        s = sections
        separators = {c.separator for c in controllers.values() if getattr(c, "separator", None)}
        tapped = {}
        if separators:  # validate has checked that the taps run inside the engine
            tapped = dict(tap=s.tap, positions={"checkpoints": [], "stride": None,
                                                "separator": separators.pop()})
        with open_vllm_engine(s.model, s.engine, s.cache_dir, s.task, params, in_process=True,
                              **tapped) as (engine, *_):
            return {name: run_in_path(VllmSteps(engine), tokenizer, problems, s.search.n_paths,
                                      s.seed, c) for name, c in controllers.items()}

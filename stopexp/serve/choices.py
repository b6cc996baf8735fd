"""A choice's text and log-probs, as vLLM's OpenAI server returns them: the path's text cut
before its stop string (kept with `include_stop_str_in_output`), the prompt before it with
`echo`, and with `logprobs` the LM's log-prob of each token (the prompt's too with echo; its
first token has none) with that many alternatives, from a teacher-forced forward
(stopexp.search.scoring) in the engine loop's thread."""
from __future__ import annotations

from typing import Callable

from stopexp.search.stops import split_stop
from stopexp.serve.responses import completion_logprobs


class ChoiceTexts:
    """`decode(ids)`: a path's text; `tokenizer` (under `lock`) names each token of the
    log-probs; `stepper.score(ids, start, top)` computes them."""

    def __init__(self, decode: Callable, tokenizer, lock, stepper):
        self.decode, self.tokenizer, self.lock, self.stepper = decode, tokenizer, lock, stepper

    def choice(self, gen, path) -> dict:
        """The choice answered by `path`: {text, finish_reason, logprobs}."""
        before, stop = split_stop(self.decode(path.tokens), gen.params.stop)
        text = before + stop if gen.include_stop else before
        logprobs = None
        if gen.logprobs is not None:
            ids = [*gen.prompt_ids, *path.tokens]
            start = 1 if gen.echo else len(gen.prompt_ids)
            logprobs = self._logprobs(ids, start, gen.logprobs, echo=gen.echo)
        return {"text": gen.prompt + text if gen.echo else text,
                "finish_reason": path.finish_reason or "stop", "logprobs": logprobs}

    def echoed(self, gen) -> dict:
        """The choice of a request that generates nothing: its prompt, scored."""
        logprobs = None if gen.logprobs is None else \
            self._logprobs(list(gen.prompt_ids), 1, gen.logprobs, echo=True)
        return {"text": gen.prompt, "finish_reason": "length", "logprobs": logprobs}

    def _logprobs(self, ids: list[int], start: int, top: int, echo: bool) -> dict:
        scores = self.stepper.score(ids, start, top) if start < len(ids) else []
        with self.lock:
            names = [self.tokenizer.decode([i]) for i in ids]
            wanted = {i for _, alts in scores for i, _ in alts}
            name = {i: self.tokenizer.decode([i]) for i in wanted}
        rows = [(lp, [(names[k], lp), *((name[i], v) for i, v in alts)])
                for k, (lp, alts) in zip(range(start, len(ids)), scores)]
        if echo:
            return completion_logprobs(names, [None, *rows])
        return completion_logprobs(names[start:], rows)

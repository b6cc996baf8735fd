"""lm-evaluation-harness against the toy's server in a few seconds: the shipped task of the
toy's own arithmetic (evals/lm_eval/stopexp_arith.yaml) through `local-completions` asks
what a plain client asking the same prompts with the same seed gets, and grades it with
stopexp's grader; a generation longer than the server gives is the server's 400, whose
message the harness' failure carries."""
import numpy as np
import openai
import pytest
from omegaconf import OmegaConf

from conftest import ROOT
from stopexp.tasks import build_task
from test_serve import running, trained  # noqa: F401  (trained: the fixture)

DOCS = 3


def harness(url: str, **gen):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    return simple_evaluate(
        model="local-completions", tasks=["stopexp_arith"], limit=DOCS,
        gen_kwargs=",".join(f"{k}={v}" for k, v in gen.items()) or None,
        model_args=f"base_url={url}/completions,model=toy,tokenizer_backend=None,tokenized_requests=False,"
                   "seed=0,max_retries=1",
        task_manager=TaskManager(include_path=str(ROOT / "evals" / "lm_eval")), log_samples=True,
        random_seed=None, numpy_random_seed=None, torch_random_seed=None, fewshot_random_seed=None)


def test_lm_eval_scores_the_toy_server(trained):  # noqa: F811
    with running(trained) as s:
        url = f"{s.url}/v1"
        out = harness(url)
        samples = sorted(out["samples"]["stopexp_arith"], key=lambda x: x["doc_id"])
        config = OmegaConf.load(ROOT / "conf" / "task" / "arith.yaml")
        config.pop("defaults")
        task = build_task(config)
        problems = task.problems("test", DOCS)
        assert [p.prompt for p in problems] == [p.prompt for p in
                                                  build_task(s.cfg.task).problems("test", DOCS)]  # the toy's
        for sample, problem in zip(samples, problems, strict=True):
            assert sample["doc"]["stopexp_prompt"] == problem.prompt
            direct = s.client.completions.create(model="toy", prompt=problem.prompt, seed=0, temperature=1.0,
                                                 max_tokens=64)
            assert sample["resps"][0][0] == direct.choices[0].text
            assert sample["acc"] == float(task.grade(problem, direct.choices[0].text))
        assert out["results"]["stopexp_arith"]["acc,none"] == np.mean([x["acc"] for x in samples])
        with pytest.raises(openai.BadRequestError, match=r"max_tokens: must lie in 1\.\.64 \(serve\.max_tokens\)"):
            s.client.completions.create(model="toy", prompt=problems[0].prompt, max_tokens=256)

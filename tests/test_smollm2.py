"""The real small LM end to end: +exp=smollm2_contrastive, shrunk, through collect, train
and evaluate (the GGUF conversion included), offline on a CPU."""
import numpy as np
import pytest

from stopexp.config import validate
from stopexp.store import bank
from stopexp.stages import build
from tests.conftest import compose

SHRUNK = ["logger=none", "search.n_paths=8", "policy.keep=2", "collect.prompts.train=8",
          "collect.prompts.val=4", "collect.prompts.test=6", "collect.shard_prompts=6",
          "evaluate.retention=[2,4]", "evaluate.n_points=[4,8]", "evaluate.bootstrap=50",
          "evaluate.text_metrics=false", "train.epochs=5"]


@pytest.mark.slow
def test_smollm2_experiment_end_to_end(tmp_path):
    """~2 min on 2 cores: 18 prompts x 8 paths of SmolLM2-135M-Instruct on word problems."""
    from stopexp.stages.pipeline import run_pipeline

    cfg = validate(compose("pipeline", ["+exp=smollm2_contrastive", *SHRUNK,
                                        f"paths.output_dir={tmp_path}"]))
    metrics = run_pipeline(cfg, tmp_path / "run")
    root = build.bank(cfg).root
    meta = bank.read_meta(root)
    assert meta["complete"] and meta["model_name"] == "smollm2-135m-instruct"
    assert meta["num_layers"] == 30 and meta["hidden_size"] == 576
    assert bank.read_meta(build.feature_set(cfg).root, kind="features")["tap_layers"] == [15, 29]
    assert meta["task"]["extraction"] == "strict" and meta["task"]["name"] == "wordprob"

    ds = bank.load_bank(root)
    text, length = list(ds["text"][:]), np.asarray(ds["length"][:])
    assert len(text) == 18 * 8 and length.max() <= 48
    # a path ends at the task's stop strings: nothing of a next example is kept
    assert all("\nQuestion:" not in t and "\n\n" not in t.rstrip("\n") for t in text)
    assert np.mean([t.rstrip().endswith("\n") or "\n" in t[-3:] or l == 48
                    for t, l in zip(text, length)]) > 0.8  # most end at a stop, few at max length
    correct = np.asarray(ds["correct"][:])
    assert 0 < correct.mean() < 1  # a real mix of right and wrong paths

    methods = metrics["methods"]
    assert {"no_prune", "random", "confidence", "hidden_norm", "mlp", "oracle"} <= set(methods)
    assert methods["mlp"]["tokens_ratio"] < 1 and methods["oracle"]["accuracy"] >= methods["random"]["accuracy"]
    assert metrics["protocol"] == {**metrics["protocol"], "n": 8, "k": 2, "check_tokens": 6}
    assert (tmp_path / "run" / "evaluate" / "pareto.png").exists()

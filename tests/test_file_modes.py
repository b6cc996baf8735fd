"""Every file and directory stopexp writes has the mode the user's umask gives a new one
(docs/artifacts.md), whichever library wrote it: a whole pipeline's cache and run dirs, and
each kind of writer through both ways of publishing (`atomic_path`, `staging_dir` +
`publish_dir`)."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import SMALL_BANK, run_stage
from stopexp.runtime.artifacts import atomic_path, publish_dir, staging_dir

UMASK = 0o007  # a group shares the outputs: 0660 / 0770, which no library's default gives


@pytest.fixture
def group_umask():
    old = os.umask(UMASK)
    yield
    os.umask(old)


def modes(root: Path) -> dict[str, str]:
    """Each file's and directory's mode under `root`, by its path relative to it."""
    return {str(p.relative_to(root)): oct(stat.S_IMODE(p.stat().st_mode))
            for p in root.rglob("*") if not p.is_symlink()}


def wrong(found: dict[str, str], root: Path) -> dict[str, str]:
    want = {True: oct(0o777 & ~UMASK), False: oct(0o666 & ~UMASK)}
    return {name: mode for name, mode in found.items() if mode != want[(root / name).is_dir()]}


def save_safetensors(path):
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(path))  # through a private temporary of its own


def save_parquet(path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"a": [1, 2]}), path)


def save_figure(path):
    from stopexp.evaluation import plots

    plots.prune_steps({"x": np.array([1, 2])}, path)


WRITERS = {
    "safetensors": save_safetensors,
    "torch": lambda p: torch.save({"w": torch.zeros(2)}, p),
    "numpy": lambda p: np.save(open(p, "wb"), np.zeros(2)),
    "parquet": save_parquet,
    "json": lambda p: Path(p).write_text(json.dumps({"a": 1})),
    "figure": save_figure,
}


@pytest.mark.parametrize("writer", list(WRITERS))
def test_every_writer_publishes_with_the_umask(writer, tmp_path, group_umask):
    if writer != "figure":  # save_figure publishes through atomic_path itself
        with atomic_path(tmp_path / "single" / "out") as tmp:
            WRITERS[writer](tmp)
    else:
        save_figure(tmp_path / "single" / "out")
    final = tmp_path / "artifact"
    staged = staging_dir(final)
    (staged / "sub").mkdir(mode=0o700)
    WRITERS[writer](staged / "sub" / "out")
    publish_dir(staged, final)
    found = modes(tmp_path)
    assert {"single/out", "artifact", "artifact/sub", "artifact/sub/out"} <= set(found)
    assert wrong(found, tmp_path) == {}


def test_every_file_of_a_pipeline_has_the_umasks_mode(tmp_path, group_umask):
    """Collect, featurize, train and evaluate into a fresh output dir: the bank, the
    features, the predictor (safetensors), the run dirs (config, metrics, figures, prompt
    records) and the artifacts' lock files."""
    out = tmp_path / "outputs"
    run_stage("pipeline", [f"paths.output_dir={out}", *SMALL_BANK, "train.epochs=2",
                           "evaluate.methods=[learned]", "evaluate.text_metrics=false",
                           "evaluate.bootstrap=20", f"hydra.run.dir={tmp_path / 'run'}"])
    found = modes(tmp_path)
    kinds = {"predictor.safetensors", "predictor.json", "shard.json", "meta.json", "metrics.json",
             "config.yaml", "prompts.jsonl"}
    assert kinds <= {Path(name).name for name in found}, sorted(found)
    assert any(name.endswith(".png") for name in found) and any(".lock" in n for n in found)
    assert wrong(found, tmp_path) == {}

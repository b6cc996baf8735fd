"""The standard figures, written as PNG files (headless matplotlib). Each function takes
plain arrays/dicts, so notebooks can call them on loaded outputs as well."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from stopexp.metrics import reliability  # noqa: E402


def _save(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def loss_curve(history: list[dict], path: Path) -> Path:
    """Training loss and validation within-prompt AUROC per epoch."""
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    epochs = [h["epoch"] for h in history]
    ax.plot(epochs, [h["train_loss"] for h in history], "o-", label="train loss")
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss")
    ax2 = ax.twinx()
    ax2.plot(epochs, [h["val_auroc"] for h in history], "s--", color="C1",
             label="val AUROC (within-prompt)")
    ax2.set_ylabel("AUROC")
    fig.legend(loc="upper right", fontsize=8)
    return _save(fig, path)


def score_histogram(scores, correct, path: Path, title: str = "") -> Path:
    """Signal distribution for paths that end right vs wrong."""
    scores, correct = np.asarray(scores, float), np.asarray(correct, bool)
    fig, ax = plt.subplots(figsize=(5, 3.3))
    bins = np.histogram_bin_edges(scores[np.isfinite(scores)], bins=40)
    ax.hist(scores[correct], bins=bins, alpha=0.6, density=True, label="ends right")
    ax.hist(scores[~correct], bins=bins, alpha=0.6, density=True, label="ends wrong")
    ax.set_xlabel("signal")
    ax.set_ylabel("density")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    return _save(fig, path)


def reliability_diagram(probs, correct, path: Path, title: str = "") -> Path:
    r = reliability(np.asarray(probs, float), np.asarray(correct, float))
    fig, ax = plt.subplots(figsize=(4, 4))
    ax.plot([0, 1], [0, 1], ":", color="gray")
    ok = np.isfinite(r["accuracy"])
    ax.plot(np.asarray(r["confidence"])[ok], np.asarray(r["accuracy"])[ok], "o-")
    ax.set_xlabel("predicted probability")
    ax.set_ylabel("observed success rate")
    ax.set_title(title, fontsize=9)
    return _save(fig, path)

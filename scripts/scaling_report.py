"""Does the hidden state add anything with more data? From one trace bank and its features:
predictors trained on the first 150, 300, 600 and 1200 of its train prompts (nested:
train.max_prompts), each scored on the test split at about 20%, 40%, 60% and 80% of a
typical path, against confidence; then, on the most prompts, the mlp's anti-overfitting
controls, and the predictors by tapped layer.

    scripts/main.sh +exp=smollm2_scaling          # the bank and its features (collect, featurize, ...)
    python scripts/scaling_report.py +exp=smollm2_scaling [--sizes=150,300,600,1200] [--out=DIR]

Hydra overrides compose the bank's config as train's do. Needs no LM: every predictor is
trained by the train stage (`stopexp.stages.train.train`), found in the cache by its key
when it exists, from the bank and features, which must be there (a missing one ends the
script with the command that makes it; nothing is collected or featurized here).

- Sizes: `--sizes` (default 150,300,600,1200); one above the bank's train prompts is lowered
  to them, and the size that is all of them trains with train.max_prompts unset, the key
  the pipeline's own predictor has.
- Predictors: linear, mlp, hidden_conf (the hidden state fused with the confidence columns)
  and conf_features (the confidence columns alone), each with its yaml's settings and the
  config's train section.
- Positions: the median test path length times 0.2, 0.4, 0.6, 0.8, each at the nearest
  position every path has features at (a checkpoint or a multiple of tap.positions.stride:
  `stopexp.evaluation.scaling.share_positions`).
- A cell: the within-prompt AUROC on the test paths alive there, and the paired bootstrap
  over the prompts with both outcomes (evaluate.bootstrap resamples, evaluate.seed) of its
  difference from confidence (`stopexp.evaluation.scaling.versus`). train / val / test: the
  within-prompt AUROC averaged over the four positions on the predictor's own training
  prompts (the first N), the validation and the test prompts: how much it learns its
  prompts (train's own metrics, averaged over every stored position, are in the JSON).
- The fusion's own difference: hidden_conf - conf_features at each size and position, the
  same paired bootstrap (what the hidden state adds to the confidence columns it is fused with).
- Corrections: each table is one family; beside every interval its bootstrap p-value and
  Holm's adjusted one over the table's cells, * where it survives at family-wise 0.05
  (`stopexp.metrics.multiplicity`: the p-value inverts the percentile interval).
- Controls, mlp at the largest size: early stopping on the validation prompts (what train
  does: the baseline row), no early stopping (train.early_stopping=false: every epoch, the
  last kept), weight decay 0.1 and 1.0 (the default is 0.01), dropout 0.5, PCA to 32
  components (predictor.pca_components), per-prompt centring (predictor.centre_prompts).
- Layers: linear and mlp on each tapped layer (predictor.layer) at the size whose mlp ranks
  the validation paths best (its val AUROC above). The bank's tap.layers only: other layers are re-extracted from
  the stored paths without regenerating them, e.g.
  `python -m stopexp.featurize +exp=smollm2_scaling "tap.layers=[4,10,15,22,29]"`, then
  this script with the same tap override.

Prints the tables as markdown; writes scaling.json and scaling.png (AUROC against training
prompts, one line per predictor, the paired interval as a band, log x) into --out
(default <paths.output_dir>/scaling/<features key>).
"""
from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import numpy as np
import torch

from stopexp.core.errors import ConfigError, reported
from stopexp.evaluation import scaling
from stopexp.evaluation.curves import prefix_scores
from stopexp.metrics.multiplicity import holm_note
from stopexp.runtime.artifacts import write_json
from stopexp.signals import methods as M
from stopexp.signals.saved_predictor import load_predictor
from stopexp.stages import build
from stopexp.stages.train import train
from stopexp.store import bank, feature_rows, feature_sets
from stopexp.training.data import first_prompts
from stopexp.runtime.overrides import stage_config

log = logging.getLogger("scaling_report")

PREDICTORS = ("linear", "mlp", "hidden_conf", "conf_features")
CONTROLS = (("early stopping on val (baseline)", []),
            ("no early stopping", ["train.early_stopping=false"]),
            ("weight decay 0.1", ["train.weight_decay=0.1"]),
            ("weight decay 1.0", ["train.weight_decay=1.0"]),
            ("dropout 0.5", ["predictor.dropout=0.5"]),
            ("PCA 32", ["predictor.pca_components=32"]),
            ("centred per prompt", ["predictor.centre_prompts=true"]))
LAYER_PREDICTORS = ("linear", "mlp")
OPTIONS = ("--sizes", "--out")


def parse(argv: list[str]) -> tuple[dict, list[str]]:
    """(the script's --options, the Hydra overrides); ConfigError for an unknown --option."""
    options, overrides = {}, []
    for arg in argv:
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            if name not in OPTIONS or not eq:
                raise ConfigError(f"{name}: unknown option; give {' or '.join(o + '=...' for o in OPTIONS)} "
                                  "and Hydra overrides")
            options[name] = value
        else:
            overrides.append(arg)
    return options, overrides


class Report:
    """The bank's paths of every split at the compared positions, and every predictor
    trained and scored on them."""

    def __init__(self, overrides: list[str]):
        self.overrides = overrides
        self.cfg = cfg = stage_config("train", overrides)
        self.features = build.feature_set(cfg)
        root = bank.require_bank(self.features.bank, overrides)  # never collects: names the command
        self.spec = feature_sets.spec_of(cfg.tap.layers, bank.read_meta(root))
        loaded = {split: feature_rows.load_split(self.features, split, overrides)  # names featurize's command
                  for split in ("train", "val", "test")}
        ds, feats = loaded["test"]
        self.median = float(np.median(np.asarray(ds["length"][:])))
        grid = sorted(set(scaling.grid_positions(self.features.positions, cfg.search.max_new_tokens))
                      & set(np.unique(feats.positions).tolist()))
        self.positions = scaling.share_positions(self.median, grid)
        self.batches = {}
        for split, (ds, feats) in loaded.items():
            rows = feature_rows.position_batch(ds, feats, self.positions)
            self.batches[split] = bank.select_rows(rows, rows["alive"])
        self.train_ids = np.asarray(loaded["train"][0]["prompt_id"][:])  # per row of the train split
        self.held = len(np.unique(self.train_ids))
        test = self.batches["test"]
        self.confidence = M.confidence(test).numpy().astype(float)
        self.columns = tuple(test[k].numpy() for k in ("correct", "group", "position"))
        self.scores = {}  # (predictor, size) -> test scores, for the fusion's own difference
        self.n_boot, self.seed = int(cfg.evaluate.bootstrap), int(cfg.evaluate.seed)

    def fit_gap(self, model, size: int) -> dict:
        """The within-prompt AUROC at the positions (mean over them) on the predictor's own
        training prompts (the first `size`), on the validation and on the test prompts."""
        out = {}
        for split, rows in self.batches.items():
            if split == "train":
                mine = first_prompts(self.train_ids, size)[rows["path"].numpy()]
                rows = bank.select_rows(rows, torch.from_numpy(mine))
            scores = prefix_scores({"s": M.learned(model)}, rows)["s"]
            out[split] = scaling.mean_auroc(scores, rows["correct"].numpy(), rows["group"].numpy(),
                                            rows["position"].numpy())
        return out

    def run(self, predictor: str, size: int, extra: list[str] = ()) -> dict:
        """Train (or find) `predictor` on the first `size` train prompts with `extra`
        overrides, and score it at the positions against confidence."""
        limit = [f"train.max_prompts={size}"] if size < self.held else []
        cfg = stage_config("train", [*self.overrides, f"predictor={predictor}", *limit, *extra])
        start = time.time()
        m = train(cfg, progress=False)
        model, _ = load_predictor(m["checkpoint"], self.spec, cfg.predictor)
        test = self.batches["test"]
        scores = prefix_scores({predictor: M.learned(model)}, test)[predictor]
        if not extra:
            self.scores[(predictor, size)] = scores
        at = []
        for p in self.positions:
            here = (test["position"] == p).numpy()
            at.append({"position": p, **scaling.versus(scores[here], self.confidence[here],
                                                        test["correct"].numpy()[here],
                                                        test["group"].numpy()[here],
                                                        self.n_boot, self.seed)})
        gap = self.fit_gap(model, size)
        log.info("%s, %d prompts %s: %s; train / val / test %.3f / %.3f / %.3f (%.0f s)", predictor,
                 size, " ".join(extra), ", ".join(f"{a['auroc']:.3f}" for a in at), gap["train"],
                 gap["val"], gap["test"], time.time() - start)
        return {"predictor": predictor, "size": size, "overrides": [*limit, *extra],
                # a predictor saved before train.max_prompts existed trained on every train prompt
                "train_prompts": m.get("train_prompts", size), "checkpoint": m["checkpoint"],
                "best_epoch": m["best_epoch"], "epochs": m["epochs"],
                "train_auroc": gap["train"], "val_auroc": gap["val"], "test_auroc": gap["test"],
                # train's own, averaged over every stored position (step ends included)
                "train_metrics_auroc": {split: m[split]["auroc"] for split in ("train", "val", "test")
                                        if split in m},
                "at": at}


def main(argv: list[str]) -> dict:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    options, overrides = parse(argv)
    sizes = scaling.parse_sizes(options["--sizes"]) if "--sizes" in options else list(scaling.SIZES)
    report = Report(overrides)
    cfg, shares = report.cfg, scaling.SHARES
    sizes = scaling.clip_sizes(sizes, report.held)
    log.info("bank %s, features %s: %d train prompts held, sizes %s; test positions %s tokens "
             "(median path %.0f tokens)", report.features.bank.key, report.features.key,
             report.held, sizes, report.positions, report.median)
    by_size = [report.run(p, n) for n in sizes for p in PREDICTORS]
    largest = sizes[-1]
    baseline = next(r for r in by_size if r["predictor"] == "mlp" and r["size"] == largest)
    controls = [{**baseline, "control": CONTROLS[0][0]}] + [
        {**report.run("mlp", largest, extra), "control": label} for label, extra in CONTROLS[1:]]
    mlps = [r for r in by_size if r["predictor"] == "mlp"]
    best = max(mlps, key=lambda r: (np.nan_to_num(r["val_auroc"], nan=-1.0), r["size"]))["size"]
    tapped = report.spec.tap_layers
    deepest = max(tapped)
    layers = []
    for layer in tapped:
        for p in LAYER_PREDICTORS:
            same = [r for r in by_size if r["predictor"] == p and r["size"] == best]
            row = same[0] if layer == deepest else report.run(p, best, [f"predictor.layer={layer}"])
            layers.append({**row, "layer": layer})
    reference = by_size[0]["at"]
    fusion = [{"prompts": n, "at": scaling.differences(
        report.scores[("hidden_conf", n)], report.scores[("conf_features", n)], report.positions,
        *report.columns, report.n_boot, report.seed)} for n in sizes]
    (by_size, m_size), (controls, m_controls), (layers, m_layers), (fusion, m_fusion) = (
        scaling.corrected(rows) for rows in (by_size, controls, layers, fusion))

    out = Path(options.get("--out") or Path(cfg.paths.output_dir) / "scaling" / report.features.key)
    out.mkdir(parents=True, exist_ok=True)
    caption = (f"{cfg.model.name}, bank {report.features.bank.key}: within-prompt AUROC on "
               f"{len(np.unique(report.batches['test']['group'].numpy()))} test prompts, trained at "
               f"{'every position' if cfg.train.positions == 'all' else 'one checkpoint'}; "
               f"band: paired 95% bootstrap vs confidence")
    figure = scaling.plot(by_size, report.positions, shares, out / "scaling.png", caption)
    result = {"bank": report.features.bank.key, "features": report.features.key,
              "overrides": overrides, "train_prompts_held": report.held, "sizes": sizes,
              "shares": list(shares), "positions": report.positions, "median_length": report.median,
              "bootstrap": report.n_boot, "seed": report.seed, "best_size": best,
              "tap_layers": list(tapped), "by_size": by_size, "controls": controls, "layers": layers,
              "hidden_conf_minus_conf_features": fusion,
              "holm_families": {"by_size": m_size, "controls": m_controls, "layers": m_layers,
                                "hidden_conf_minus_conf_features": m_fusion},
              "confidence": [{k: a[k] for k in ("position", "reference_auroc", "mixed_prompts")}
                             for a in reference]}
    write_json(out / "scaling.json", result)

    print(f"## Within-prompt AUROC on the test split against training prompts\n\n"
          f"bank {report.features.bank.key}, features {report.features.key}; positions at "
          f"{', '.join(f'{round(100 * s)}%' for s in shares)} of the median test path "
          f"({report.median:.0f} tokens); a cell: AUROC (minus confidence [95% paired bootstrap "
          f"over the mixed prompts, {report.n_boot} resamples])\n")
    note = (lambda m: f"\n{holm_note(m, report.n_boot)}")
    print(scaling.markdown_table([{**r, "prompts": r["size"]} for r in by_size], report.positions,
                                 shares, ("prompts", "predictor"), reference) + note(m_size))
    print(f"\n## The hidden state's share of the fusion: hidden_conf - conf_features\n\n"
          f"the same paths and prompts; a cell: the paired difference of their within-prompt "
          f"AUROC [95% paired bootstrap]\n")
    print(scaling.difference_table(fusion, report.positions, shares, "prompts") + note(m_fusion))
    print(f"\n## Anti-overfitting controls: mlp on {largest} prompts\n")
    print(scaling.markdown_table(controls, report.positions, shares, ("control",)) + note(m_controls))
    print(f"\n## By tapped layer, {best} prompts (the size whose mlp ranks validation paths best)\n")
    print(scaling.markdown_table(layers, report.positions, shares, ("layer", "predictor"))
          + note(m_layers))
    print(f"\n{out / 'scaling.json'}\n{figure}")
    return result


if __name__ == "__main__":
    with reported():
        main(sys.argv[1:])

"""scripts/check_readme_table.py: the README's main-job table against a run's metrics.json."""
import importlib.util
import json
import subprocess
import sys

from conftest import ROOT

spec = importlib.util.spec_from_file_location("check_readme_table", ROOT / "scripts/check_readme_table.py")
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)

README = """intro
## What the main job shows

```
Launch-Check-Resume 64 -> 8 at 5 tokens, 200 test prompts (replay)
method         accuracy          95% CI   avg@K    tokens  ratio  AUROC  pooled  wall s
no_prune          0.985   [0.965,1.000]   0.561    420023   1.00      -       -    11.2
random            0.835   [0.785,0.885]   0.566    108557   0.26  0.498   0.499     3.1
conf_features     0.955   [0.925,0.980]   0.908    117520   0.28  0.840   0.728     3.3
points (N -> K: accuracy / tokens): no_prune 8->8: 0.800 / 52217
```
"""


def metrics(**changes):
    rows = {"no_prune": (0.985, [0.965, 1.0], 0.5614, 420023, 1.0, None, None),
            "random": (0.835, [0.785, 0.885], 0.566, 108557, 0.2585, 0.4981, 0.499),
            "conf_features": (0.955, [0.925, 0.98], 0.908, 117520, 0.28, 0.8402, 0.728)}
    methods = {}
    for name, (acc, ci, avg, tok, ratio, au, pooled) in rows.items():
        r = {"accuracy": acc, "accuracy_ci": ci, "avg_at_k": avg, "tokens_total": float(tok),
             "tokens_ratio": ratio, "wall_s": 1.0}
        if au is not None:
            r.update(auroc=au, auroc_pooled=pooled)
        methods[name] = {**r, **changes.get(name, {})}
    return {"methods": methods, "mode": "replay",
            "protocol": {"n": 64, "k": 8, "check_tokens": 5, "prompts": 200, "split": "test"}}


def test_parser_reads_every_column_and_a_dash_as_missing():
    t = check.parse_table(README)
    assert t["protocol"] == {"n": 64, "k": 8, "check_tokens": 5, "prompts": 200, "split": "test",
                             "mode": "replay"}
    assert list(t["methods"]) == ["no_prune", "random", "conf_features"]
    assert t["methods"]["conf_features"] == {"accuracy": 0.955, "ci_low": 0.925, "ci_high": 0.98,
                                             "avg@K": 0.908, "tokens": 117520.0, "ratio": 0.28,
                                             "AUROC": 0.84, "pooled": 0.728}
    assert t["methods"]["no_prune"]["AUROC"] is None


def test_comparer_passes_equal_tables_and_names_each_difference():
    readme = check.parse_table(README)
    assert check.compare(readme, check.from_metrics(metrics())) == []
    fresh = check.from_metrics(metrics(conf_features={"accuracy": 0.95, "auroc": 0.837},
                                       random={"tokens_total": 111000.0}))
    assert check.compare(readme, fresh, tol=0.01) == ["random tokens: README 108557, run 111000 "
                                                      "(differs by +2443)"]
    assert sorted(check.compare(readme, fresh, tol=0.0, tokens_rtol=0.05)) == [
        "conf_features AUROC: README 0.84, run 0.837 (differs by -0.003)",
        "conf_features accuracy: README 0.955, run 0.95 (differs by -0.005)"]
    other = metrics()
    other["protocol"]["prompts"] = 100
    del other["methods"]["random"]
    assert sorted(check.compare(readme, check.from_metrics(other))) == [
        "protocol prompts: README 200, run 100", "random: in the README, not in the run"]


def test_script_exit_code_and_the_real_readme_parses(tmp_path):
    (tmp_path / "README.md").write_text(README)
    (tmp_path / "metrics.json").write_text(json.dumps(metrics(conf_features={"accuracy": 0.9})))
    cmd = [sys.executable, "scripts/check_readme_table.py", str(tmp_path), "--readme",
           str(tmp_path / "README.md")]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1 and "conf_features accuracy: README 0.955, run 0.9" in r.stdout
    assert "0.955 / 0.9" in r.stdout  # the side-by-side table
    (tmp_path / "metrics.json").write_text(json.dumps(metrics()))
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0 and "the README's table matches" in r.stdout
    real = check.parse_table((ROOT / "README.md").read_text())
    assert {"no_prune", "random", "confidence", "oracle", "conf_features"} <= set(real["methods"])

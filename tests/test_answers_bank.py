"""The answers-only bank importer and its replay, on the hand-made fixture
tests/data/answers_bank.json (3 prompts; 8, 6 and 6 branches; probe every 10 tokens)."""
import json
import re

import numpy as np
import pytest

from conftest import ROOT, run_stage
from stopexp.stopping.answers_bank import AnswersBankError, load_answers_bank, vote_codes
from stopexp.stopping.branch_draws import draws, no_prune, random_keep, replay
from stopexp.stages import build

FIXTURE = ROOT / "tests" / "data" / "answers_bank.json"


@pytest.fixture(scope="module")
def bank():
    return load_answers_bank(FIXTURE)


def test_answers_are_canonical_codes(bank):
    p0, p1, p2 = bank.prompts
    assert p0.answers == ["", "42", "7", "13", "9"]     # \frac{84}{2} and 42.0 are 42
    assert p0.final.tolist() == [1, 1, 3, 1, 3, 1, 4, 1]
    assert p0.tokens.tolist() == [35, 45, 30, 60, 50, 25, 70, 40]
    assert p0.correct.tolist() == [False, True, False, False, False]
    assert p1.gold == "1/2" and p1.final.tolist() == [1, 1, 1, 1, 2, 1]  # 0.5, .5, \frac{1}{2}
    assert p2.final.tolist() == [1, 1, 2, 1, 2, 0]  # a null final answer is none
    assert p0.probes.shape == (8, 6) and p0.probes[1].tolist() == [2, 1, 1, 1, 0, 0]


def test_answer_at_reads_the_probe_then_the_final_answer(bank):
    p0 = bank.prompts[0]
    assert p0.answer_at(1).tolist() == [0, 2, 0, 1, 3, 0, 4, 0]
    # after 30 tokens: branch 2 (30 tokens) and 5 (25) have ended with their final answers
    assert p0.answer_at(3).tolist() == [1, 1, 3, 1, 3, 1, 4, 1]
    assert p0.answer_at(7).tolist() == p0.final.tolist()


def test_vote_ties_go_to_the_answer_seen_first():
    assert vote_codes(np.array([0, 3, 2, 2, 3])) == 3
    assert vote_codes(np.array([0, 0])) == 0
    assert vote_codes(np.array([2, 1, 1])) == 1


@pytest.mark.parametrize("data, message", [
    ({}, "must hold a non-empty list of prompts"),
    ([{"question": "q", "gold_answer": "1", "each_branch": []}], "prompt 0: missing key(s) probe_freq"),
    ([{"question": "q", "gold_answer": "1", "probe_freq": 0, "each_branch": [[[], 1, "1"]]}],
     "prompt 0.probe_freq: must be an integer in 1..1099511627776, got 0"),
    ([{"question": "q", "gold_answer": "1", "probe_freq": 5, "each_branch": [[[], -3, "1"]]}],
     "each_branch[0][1] (total_tokens): must be an integer in 0..1099511627776, got -3"),
    ([{"question": "q", "gold_answer": "1", "probe_freq": 5, "each_branch": [[[], 3]]}],
     "each_branch[0]: a branch must be [intermediate_answers, total_tokens, final_answer]"),
    ([{"question": "q", "gold_answer": " ", "probe_freq": 5, "each_branch": [[[], 3, "1"]]}],
     "prompt 0.gold_answer: no readable answer"),
    ([{"question": "q", "gold_answer": "1", "probe_freq": 5, "each_branch": [[[["x"]], 3, "1"]]}],
     "each_branch[0][0][0]: an answer must be a string"),
    # inconsistent or impossible counts: more probes than the tokens allow, floats, huge ints
    ([{"question": "q", "gold_answer": "1", "probe_freq": 4,
       "each_branch": [[["1"] * 2, 8, "1"], [["1"] * 30, 4, "1"]]}],
     "prompt 0.each_branch[1][1] (total_tokens): 4 tokens, but its 30 intermediate answers are "
     "read every probe_freq=4 tokens, the last after 120"),
    ([{"question": "q", "gold_answer": "1", "probe_freq": 5, "each_branch": [[["1", "1"], 4, "1"]]}],
     "each_branch[0][1] (total_tokens): 4 tokens, but its 2 intermediate answers"),
    ([{"question": "q", "gold_answer": "1", "probe_freq": 5, "each_branch": [[[], 10**30, "1"]]}],
     f"each_branch[0][1] (total_tokens): must be an integer in 0..1099511627776, got {10**30}"),
    ([{"question": "q", "gold_answer": "1", "probe_freq": 5, "each_branch": [[[], 12.5, "1"]]}],
     "each_branch[0][1] (total_tokens): must be an integer in 0..1099511627776, got 12.5"),
    ([{"question": "q", "gold_answer": "1", "probe_freq": 5, "each_branch": [[[], 12.0, "1"]]}],
     "each_branch[0][1] (total_tokens): must be an integer in 0..1099511627776, got 12.0"),
    ([{"question": "q", "gold_answer": "1", "probe_freq": float("nan"), "each_branch": [[[], 3, "1"]]}],
     "prompt 0.probe_freq: must be an integer in 1..1099511627776, got nan"),
    ([{"question": "q", "gold_answer": "1", "probe_freq": 2**41, "each_branch": [[[], 3, "1"]]}],
     f"prompt 0.probe_freq: must be an integer in 1..1099511627776, got {2**41}"),
    ([{"question": "q", "gold_answer": "1", "probe_freq": 5, "each_branch": [[[], 3, float("inf")]]}],
     "each_branch[0][2]: an answer must be a string (or null) or a finite number, got inf"),
])
def test_bad_files_fail_naming_the_place(tmp_path, data, message):
    path = tmp_path / "bank.json"
    path.write_text(json.dumps(data))
    with pytest.raises(AnswersBankError, match=re.escape(message)):
        load_answers_bank(path)


def test_broken_json_and_missing_files(tmp_path):
    path = tmp_path / "bank.json"
    path.write_text('[\n{"question": "q",\n')
    with pytest.raises(AnswersBankError, match=r"bank.json: not JSON \(line 3"):
        load_answers_bank(path)
    with pytest.raises(FileNotFoundError, match="nothing.json does not exist"):
        load_answers_bank(tmp_path / "nothing.json")
    with pytest.raises(AnswersBankError, match="format 'latex' unknown; allowed: numeric, boxed"):
        load_answers_bank(FIXTURE, "latex")
    path.write_bytes(b'[{"question": "\xff"}]')  # before: UnicodeDecodeError
    with pytest.raises(AnswersBankError, match=r"bank.json: byte 15 \(0xff\) is not UTF-8; save the file as UTF-8"):
        load_answers_bank(path)


def test_an_integer_past_pythons_conversion_limit_is_an_answer_or_a_named_count(tmp_path):
    huge = "7" * 5000  # more digits than int() converts (4300): json.loads raises ValueError
    path = tmp_path / "bank.json"
    path.write_text(f'[{{"question": "q", "gold_answer": {huge}, "probe_freq": 10, '
                    f'"each_branch": [[[{huge}], 20, {huge}], [["1"], 20, 2]]}}]')
    p = load_answers_bank(path, "numeric").prompts[0]
    assert p.gold == huge and p.answers == ["", huge, "1", "2"]
    assert p.final.tolist() == [1, 3] and p.probes.tolist() == [[1], [2]]
    assert p.correct.tolist() == [False, True, False, False]
    path.write_text(f'[{{"question": "q", "gold_answer": 1, "probe_freq": {huge}, '
                    '"each_branch": [[[], 20, 1]]}]')
    with pytest.raises(AnswersBankError, match=r"^[^\n]*bank.json: prompt 0.probe_freq: must be an integer "
                                               r"in 1..1099511627776, got a 5000-digit integer\. Expected"):
        load_answers_bank(path)


def test_draws_are_seeded_permutations_shared_by_methods(bank):
    a, b = draws(bank, 6, 3, seed=0), draws(bank, 6, 3, seed=0)
    assert all((x == y).all() for d, e in zip(a, b) for x, y in zip(d, e))
    assert sorted(a[0][1].tolist()) == list(range(6)) and len(a[0][0]) == 6
    assert not (a[0][0] == a[1][0]).all()
    with pytest.raises(ValueError, match=r"n=7 branches per prompt: must be in 1..6 \(prompt 1"):
        draws(bank, 7, 3, seed=0)


def test_no_prune_over_all_branches_is_the_same_in_every_shuffle(bank):
    r = replay(bank, {"no_prune": no_prune}, draws(bank, 6, 4, seed=1))["no_prune"]
    # any 6 of prompt 0's 8 branches hold at least three 42s against at most two 13s
    full = replay(bank, {"no_prune": no_prune}, [[np.arange(8), np.arange(6), np.arange(6)]])["no_prune"]
    assert full["accuracy"] == pytest.approx(2 / 3) and full["accuracy_std"] == 0
    assert full["tokens_per_prompt"] == pytest.approx((355 + 88 + 113) / 3)
    assert full["tokens_ratio"] == 1 and full["wrongly_pruned"] is None
    assert r["accuracy"] == pytest.approx(2 / 3) and r["accuracy_std"] == 0
    assert r["tokens_per_prompt_std"] > 0  # prompt 0 drops two of its eight branches


def test_random_keeps_k_of_the_running_branches(bank):
    p0 = bank.prompts[0]
    d = random_keep(p0, np.arange(8), k=2, check_tokens=30)
    # running after 30 tokens: every branch but 2 (30) and 5 (25); keep 0 and 1
    assert d.spent.tolist() == [35, 45, 30, 30, 30, 25, 30, 30]
    assert d.answer == 1  # votes: 42, 42, 13 (ended), 42 (ended)
    assert d.stopped(p0.tokens).tolist() == [False, False, False, True, True, False, True, True]


def replay_cli(argv: list[str], out) -> dict:
    """`python -m stopexp.answers_replay ARGV` run here into `out`; its metrics.json."""
    run_stage("answers_replay", [*argv, f"hydra.run.dir={out}"])
    return json.loads((out / "metrics.json").read_text())


def test_cli_prints_the_table_and_writes_metrics(tmp_path, capsys):
    out = tmp_path / "replay"
    metrics = replay_cli([f"bank={FIXTURE}", "n=6", "k=2", "check_tokens=10", "shuffles=5",
                          "stopping.esc.window=2", "stopping.parallel_probe.stable=2",
                          "stopping.parallel_probe.warmup=0"], out)
    text = capsys.readouterr().out
    assert "3 prompts, n=6 of the stored branches, mean (std) over 5 shuffles" in text
    for m in ("no_prune", "random", "esc", "adaptive_consistency", "parallel_probe"):
        assert m in metrics["methods"] and m in text
    assert metrics["methods"]["no_prune"]["accuracy"] == pytest.approx(2 / 3)
    assert (out / "pareto.png").exists()
    assert {p["n"] for p in metrics["points"] if p["method"] == "no_prune"} == {1, 2, 4, 6}
    assert metrics["protocol"]["stopping"]["esc"] == {"window": 2}


BANK = f"bank={FIXTURE}"


@pytest.mark.parametrize("argv, message", [
    (["n=6"], "bank: give the answers-only bank, bank=PATH.json"),
    ([str(FIXTURE)], f"bank: give the answers-only bank as 'bank=\"{FIXTURE}\"'"),
    ([BANK, "windw=3"], "windw: Key 'windw' not in 'AnswersReplayConfig'"),
    ([BANK, "n=six"], "n: Value 'six' of type 'str' could not be converted to Integer"),
    ([BANK, "methods=[no_prune,esc2]"], "methods: esc2 unknown; allowed: no_prune, random, esc"),
    # an empty choice: nothing to replay, an empty table
    ([BANK, "methods=[]"], "methods: [] replays nothing; give at least one of no_prune, random"),
    ([BANK, "methods=[esc,deepconf_online]"], "methods: 'deepconf_online' runs only on a trace bank"),
    ([BANK, "n=6", "k=7"], "k: 7 must be in 1..n=6"),
    ([BANK, "methods=[no_prune]", "k=3"], "k: 3 is read only by the method random"),
    ([BANK, "stopping.esc.window=0"], "stopping.esc.window: must be >= 1, got 0"),
    ([BANK, "stopping.adaptive_consistency.threshold=nan"],
     "stopping.adaptive_consistency.threshold: must lie in (0, 1], got nan"),
    ([BANK, "esc_window=2"], "esc_window: moved: set stopping.esc.window=2"),
    ([BANK, "out=replay"], "out: moved: set hydra.run.dir=replay"),
    (["bank=no_such_bank.json"], "answers-only bank no_such_bank.json does not exist"),
])
def test_cli_refuses_bad_settings(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        run_stage("answers_replay", [*argv, f"hydra.run.dir={tmp_path}"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"error: {message}") and err.count("\n") == 1


def test_export_a_trace_bank_as_an_answers_only_bank(small_bank, tmp_path, capsys):
    import importlib.util

    from conftest import compose
    from stopexp.config import validate
    from stopexp.store import bank as trace_bank

    spec = importlib.util.spec_from_file_location("export", ROOT / "scripts" / "export_answers_bank.py")
    export = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(export)
    out = tmp_path / "answers.json"
    export.main([str(out), "--probe-freq", "4", "--", *small_bank])
    assert "wrote 6 prompts x 8 branches" in capsys.readouterr().out
    exported = load_answers_bank(out, "numeric")
    ds = trace_bank.load_bank(trace_bank.require_bank(build.bank(validate(compose("collect", small_bank)))), "test")
    assert [q.n_branches for q in exported.prompts] == [8] * 6
    first = exported.prompts[0]
    assert first.tokens.tolist() == ds["length"][:8].tolist()
    assert [first.answers[c] for c in first.final] == ds["answer"][:8].tolist()
    # a probe every 4 tokens before the end: ceil(length / 4) - 1 of them
    raw = json.loads(out.read_text())[0]["each_branch"]
    assert [len(b[0]) for b in raw] == [-(-n // 4) - 1 for n in ds["length"][:8].tolist()]
    # every prompt's correct branches are those the trace bank marks correct
    assert first.correct[first.final].tolist() == ds["correct"][:8].tolist()


def test_replay_counts_pruned_branches_and_flips(bank):
    from functools import partial

    from stopexp.stopping.answers_bank import AnswersBank
    from stopexp.stopping.esc import esc
    from stopexp.stopping.parallel_probe import parallel_probe

    one = AnswersBank(prompts=bank.prompts[:1], fmt="boxed", source="prompt 0")
    pp = partial(parallel_probe, stable=2, deviate=2, warmup=0)  # hand-traced in test_consensus
    r = replay(one, {"pp": pp}, [[np.arange(8)]])["pp"]
    assert r["tokens_per_prompt"] == 270 and r["pruned_paths"] == 4
    assert r["wrongly_pruned"] == 0.5  # branches 1 and 3 would have ended with 42
    # ESC stopping on two 13s turns no_prune's right vote wrong
    r = replay(one, {"esc": partial(esc, window=2)}, [[np.array([2, 4, 0, 1, 3, 5, 6, 7])]])["esc"]
    assert r["vs_no_prune"] == {"improved": 0, "worsened": 1} and r["accuracy"] == 0


def test_the_last_probe_may_fall_in_the_last_partial_interval(tmp_path):
    """As in the public Parallel-Probe banks (a branch of 3,856 tokens probed 8 times every
    500): the branch ends at the probe after its last stored one, even when its list is
    short, and a probe cut there spends at most the branch's total."""
    from stopexp.stopping.parallel_probe import parallel_probe

    data = [{"question": "q", "gold_answer": "1", "probe_freq": 10,
             "each_branch": [[["2", "1"], 15, "1"], [["2"], 45, "1"], [["2", "2", "2"], 60, "2"]]}]
    (tmp_path / "bank.json").write_text(json.dumps(data))
    p = load_answers_bank(tmp_path / "bank.json").prompts[0]
    assert p.end_probe.tolist() == [3, 2, 4]
    assert p.answers == ["", "2", "1"] and p.answer_at(2).tolist() == p.answer_at(3).tolist() == [2, 2, 1]
    # leader 1 at probes 2 and 3 (2 votes to 1): stop at probe 3; branch 2 deviates but
    # is not pruned with deviate=3, and spends 30 of its 60
    d = parallel_probe(p, np.arange(3), stable=1, deviate=3, warmup=0)
    assert p.answers[d.answer] == "1" and d.spent.tolist() == [15, 45, 30]


def test_exact_grader_and_the_prompts_that_move(tmp_path, capsys):
    """By cluster, 1 - \\frac{2}{\\pi} and 1-\\frac{2}{\\pi} are one answer (3 votes of 4,
    right); by string the spaced form wins (2 votes) and is not the gold string."""
    forms = ["1 - \\frac{2}{\\pi}", "1 - \\frac{2}{\\pi}", "1-\\frac{2}{\\pi}", "3"]
    data = [{"question": "q", "gold_answer": "1-\\frac{2}{\\pi}", "probe_freq": 10,
             "each_branch": [[[], 5, a] for a in forms]},
            {"question": "r", "gold_answer": "7", "probe_freq": 10, "each_branch": [[[], 5, "7"]] * 4}]
    path = tmp_path / "bank.json"
    path.write_text(json.dumps(data))
    exact = load_answers_bank(path, grader="exact").prompts[0]
    assert exact.answers == ["", *forms[::2], "3"] and exact.correct.tolist() == [False, False, True, False]
    m = replay_cli([f"bank={path}", "methods=[no_prune,esc]", "stopping.esc.window=4", "shuffles=3"],
                   tmp_path / "replay")
    assert m["methods"]["no_prune"]["accuracy"] == 1.0
    assert m["graders"]["accuracy_exact"] == {"no_prune": 0.5, "esc": 0.5}
    assert m["graders"]["moved"] == [{"prompt": 0, "gold": "1-\\frac{2}{\\pi}", "no_prune": [1.0, 0.0],
                                      "esc": [1.0, 0.0]}]
    text = capsys.readouterr().out
    assert "published grader): accuracy / tokens per prompt no_prune 0.500 / 20, esc 0.500 / 20" in text
    assert "prompt 0 (gold 1-\\frac{2}{\\pi}): no_prune 1.00 -> 0.00, esc 1.00 -> 0.00" in text
    with pytest.raises(AnswersBankError, match="grader 'strict' unknown; allowed: equivalent, exact"):
        load_answers_bank(path, grader="strict")


def test_python_shuffles_are_the_published_simulators_draws(bank):
    import random

    orders = draws(bank, 6, 2, seed=0, shuffler="python")
    for s, draw in enumerate(orders):
        for q, order in zip(bank.prompts, draw):
            idx = list(range(q.n_branches))
            random.Random(s).shuffle(idx)  # evaluation/data_loader.py Question(seed=s)
            assert order.tolist() == idx[:6]


@pytest.mark.slow
def test_the_published_parallel_probe_table_on_aime24():
    """Parallel-Probe's own AIME24 bank (zhengkid/Parallel-Probe, evaluation/Qwen3-8B-128/
    aime24.json; no license, so it is not shipped: set STOPEXP_PARALLEL_PROBE_BANKS to the
    folder holding it). Its draws (shuffler=python, 100 shuffles) and its string grader give
    the published accuracies of matrix_results_Qwen3-8B-128/aime24_raw.csv exactly, and the
    same tokens for SC@64 and Adaptive-Consistency (ESC: the csv truncates the mean).
    Parallel-Probe's tokens differ by the accounting only: the simulator charges a probe's
    full 500 tokens even past a branch's stored total."""
    import os

    folder = os.environ.get("STOPEXP_PARALLEL_PROBE_BANKS")
    if not folder:
        pytest.skip("STOPEXP_PARALLEL_PROBE_BANKS is not set")
    from stopexp.stopping.branch_draws import build_methods

    bank = load_answers_bank(os.path.join(folder, "aime24.json"), grader="exact")
    orders = draws(bank, 64, 100, 0, "python")
    names = ["no_prune", "esc", "adaptive_consistency", "parallel_probe"]
    r = replay(bank, build_methods(names, 8, 1), orders)  # every method at its defaults
    voted = replay(bank, build_methods(["parallel_probe"], 8, 1,
                                       {"parallel_probe": {"vote_pruned": True}}), orders)
    acc = {m: round(100 * v["accuracy"], 2) for m, v in r.items()}
    assert acc == {"no_prune": 80.37, "esc": 80.37, "adaptive_consistency": 80.37, "parallel_probe": 81.47}
    assert round(100 * voted["parallel_probe"]["accuracy"], 2) == 80.3
    tokens = {m: int(v["tokens_per_prompt"]) for m, v in r.items()}
    assert (tokens["no_prune"], tokens["esc"], tokens["adaptive_consistency"]) == (910813, 459359, 226033)
    assert abs(tokens["parallel_probe"] / 730781 - 1) < 0.005
    assert abs(voted["parallel_probe"]["tokens_per_prompt"] / 730225 - 1) < 0.005


# Parallel-Probe's raw release (evaluation/preprocess/data_preprocess.py of
# zhengkid/Parallel-Probe): parallel lists per prompt, each row of probe answers padded
# with trailing nulls
MATRIX = {"question": "q", "gold_answer": "\\boxed{12}", "probe_freq": 10,
          "probe_matrix_mxn": [["3", None, "12", None, None], ["12", "12", None, None, None]],
          "branch_tokens": [35, 25], "final_answers_trace": ["\\boxed{12}", "7"]}


def test_the_probe_matrix_form_is_the_branch_form(tmp_path):
    (tmp_path / "m.json").write_text(json.dumps([MATRIX]))
    each = {k: MATRIX[k] for k in ("question", "gold_answer", "probe_freq")} | {
        "each_branch": [[["3", None, "12"], 35, "\\boxed{12}"], [["12", "12"], 25, "7"]]}
    (tmp_path / "b.json").write_text(json.dumps([each]))
    m, b = (load_answers_bank(tmp_path / f).prompts[0] for f in ("m.json", "b.json"))
    assert m.answers == b.answers == ["", "3", "12", "7"]
    assert m.probes.tolist() == b.probes.tolist() == [[1, 0, 2], [2, 2, 0]]
    assert m.n_probes.tolist() == [3, 2] and m.final.tolist() == [2, 3]
    assert m.tokens.tolist() == [35, 25] and m.correct.tolist() == [False, False, True, False]
    assert m.answer_at(3).tolist() == [2, 3]  # branch 1 ends at probe 3 with its final 7


@pytest.mark.parametrize("change, message", [
    ({"branch_tokens": [35]}, r"prompt 0.branch_tokens: 1 entries for the 2 branches of probe_matrix_mxn"),
    ({"final_answers_trace": None}, r"prompt 0.final_answers_trace: the probe-matrix form needs "
                                    r"probe_matrix_mxn, branch_tokens, final_answers_trace as lists"),
    ({"probe_matrix_mxn": [["3"], "12"]}, r"prompt 0.probe_matrix_mxn\[1\]: a branch's probe answers must be a list"),
    ({"branch_tokens": [35, 4.5]}, r"prompt 0.each_branch\[1\]\[1\] \(total_tokens\): must be an integer"),
])
def test_a_bad_probe_matrix_fails_naming_file_prompt_and_key(tmp_path, change, message):
    (tmp_path / "m.json").write_text(json.dumps([MATRIX | change]))
    with pytest.raises(AnswersBankError, match=re.escape(str(tmp_path / "m.json")) + ": " + message):
        load_answers_bank(tmp_path / "m.json")

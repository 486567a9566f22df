"""Every option the tensor-parallel engine refuses (docs/design/feature_matrix.md lists them) is
refused before any worker process starts, with one ConfigError naming both the option and
`tensor_parallel_size`. No process is spawned here: the engine options are refused by
`EngineConfig` (`_check_parallel_combinations`), `quantization=` by `LLM(path, ...)` before the
checkpoint is read, the model-level ones by `check_layout` / `check_plain_modules` on the loaded
model before the workers start. (tests/engine/parallel/ runs the real engine; the request-level
`speculative=` refusal needs one, so it is checked there.)"""

from __future__ import annotations

import multiprocessing as mp

import pytest

from moe.engine import LLM
from moe.engine.config import EngineConfig
from moe.engine.parallel.launch import check_plain_modules
from moe.engine.parallel.layout import check_layout
from moe.errors import ConfigError
from moe.loading import quantize_loaded
from tests.engine.conftest import build_model

TP = dict(tensor_parallel_size=2)


@pytest.mark.parametrize("opts, named", [
    (dict(compile=True), "compile=True"),
    (dict(speculative="ngram"), "speculative='ngram'"),
    (dict(speculative="self"), "speculative='self'"),
    (dict(speculative="mtp"), "speculative='mtp'"),
    (dict(kv_cache_dtype="fp8_e4m3"), "kv_cache_dtype='fp8_e4m3'"),
    (dict(expert_cache={"experts_per_layer": 2}), "expert_cache"),
])
def test_engine_options_refused_naming_both(opts, named):
    with pytest.raises(ConfigError) as e:
        EngineConfig(**TP, **opts)
    assert named in str(e.value) and "tensor_parallel_size=2" in str(e.value), e.value
    EngineConfig(**opts)  # the option alone is fine: the refusal is the combination's


def test_quantization_refused_before_the_checkpoint_is_read(tmp_path):
    running = set(mp.active_children())
    missing = str(tmp_path / "no_such_checkpoint.pt")  # never opened: the refusal comes first
    with pytest.raises(ConfigError) as e:
        LLM(missing, quantization="int8", **TP)
    assert "quantization='int8'" in str(e.value) and "tensor_parallel_size=2" in str(e.value), e.value
    assert set(mp.active_children()) <= running


def test_from_model_refused():
    with pytest.raises(ConfigError) as e:
        LLM.from_model(build_model(260), **TP)
    assert "LLM.from_model" in str(e.value) and "tensor_parallel_size=2" in str(e.value), e.value


@pytest.mark.parametrize("fields, named", [
    (dict(qk_norm="full"), "model.qk_norm='full'"),
    (dict(expert_bias=True), "model.expert_bias"),
])
def test_model_kinds_refused_naming_both(fields, named):
    cfg = build_model(260, **fields).cfg
    check_layout(build_model(260).cfg, 2, expert_parallel=False)  # the plain model splits over 2
    for expert_parallel in (False, True):
        with pytest.raises(ConfigError) as e:
            check_layout(cfg, 2, expert_parallel)
        assert named in str(e.value) and "tensor_parallel_size=2" in str(e.value), e.value


def test_a_quantized_checkpoint_refused_naming_both():
    """A checkpoint written quantized loads quantized by itself, without `quantization=`."""
    check_plain_modules(build_model(260), 2)
    model = quantize_loaded(build_model(260), None, "int8")
    with pytest.raises(ConfigError) as e:
        check_plain_modules(model, 2)
    assert "quantized weights" in str(e.value) and "tensor_parallel_size=2" in str(e.value), e.value


def test_expert_parallel_on_one_process_is_refused():
    from moe.engine.config import EngineConfig
    from moe.errors import ConfigError
    with pytest.raises(ConfigError, match="expert_parallel=True needs tensor_parallel_size > 1"):
        EngineConfig(expert_parallel=True)
    assert EngineConfig(expert_parallel=True, tensor_parallel_size=2).expert_parallel

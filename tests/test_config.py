"""Config validation: every bad value is one clear message naming the field."""

import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir

from moe.config import Config, ConfigError, load_config
from tests.conftest import REPO


def composed(*overrides):
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def test_default_config_composes_and_validates():
    cfg = load_config(composed())
    assert isinstance(cfg, Config)
    assert cfg.router.name == "topk" and cfg.model.n_experts == 8 and cfg.data.name == "pystdlib"


def test_overrides_reach_the_dataclasses():
    cfg = load_config(composed("model.n_experts=16", "router.top_k=4", "optim.lr=3e-4", "train.max_steps=500"))
    assert (cfg.model.n_experts, cfg.router.top_k, cfg.optim.lr, cfg.train.max_steps) == (16, 4, 3e-4, 500)


@pytest.mark.parametrize("overrides,match", [
    (["router.top_k=9"], r"router.top_k=9 must be <= model.n_experts=8"),
    (["model.n_heads=4", "model.n_kv_heads=3"], r"model.n_heads=4 must be divisible by model.n_kv_heads=3"),
    (["model.d_model=-8"], r"model.d_model=-8 must be > 0"),
    (["train.batch_size=0"], r"train.batch_size=0 must be > 0"),
    (["train.dtype=fp8"], r"train.dtype='fp8' is not allowed; choose one of \['fp32', 'bf16'\]"),
    (["router.name=nope"], r"router.name='nope' is not allowed; choose one of \["),
    (["train.batch_size=10", "train.grad_accum=3"], r"train.batch_size=10 must be divisible by train.grad_accum=3"),
    (["train.seq_len=1024"], r"train.seq_len=1024 must be <= model.max_seq_len"),
])
def test_bad_values_name_the_field(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(composed(*overrides))


def test_unknown_key_is_an_error():
    with pytest.raises(ConfigError, match=r"unknown config key 'model.n_expert'"):
        load_config(composed("+model.n_expert=3"))
    with pytest.raises(ConfigError, match="bad value for 'model.n_layers'"):
        load_config(composed("model.n_layers=many"))


def test_text_data_needs_a_path():
    with pytest.raises(ConfigError, match="data.path"):
        load_config({"data": {"name": "text"}})


def _train(*args, timeout=120, env=None):
    return subprocess.run([sys.executable, "train.py", *args, "hydra.run.dir=/tmp/moe-lab-cfgtest",
                           "logger=none"], cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)


def test_train_py_exits_nonzero_with_one_clear_message():
    p = _train("router.top_k=12")
    assert p.returncode == 2
    assert "error: router.top_k=12 must be <= model.n_experts=8" in p.stderr
    assert "Traceback" not in p.stderr
    p = _train("router=nosuchrouter")
    assert p.returncode != 0
    assert "nosuchrouter" in p.stderr and "topk" in p.stderr  # Hydra lists the available options


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="both variants can run on a CUDA machine")
def test_variant_that_cannot_run_here_fails_before_any_work():
    import os
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["MOE_LAB_CACHE"] = "/nonexistent/never-used"  # data preparation must not even start
    p = _train("experts=triton", "train.device=cpu", env=env)
    assert p.returncode == 2
    assert "error: experts.name='triton'" in p.stderr and "TRITON_INTERPRET=1" in p.stderr
    p = _train("attention=flash", env=env)
    assert p.returncode == 2 and "attention.name='flash'" in p.stderr

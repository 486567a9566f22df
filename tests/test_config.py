"""Config validation: every bad value is one clear message naming the field."""

import re
import subprocess
import sys

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from moe import config as schema
from moe.config import Config
from moe.routing.routers import ROUTERS
from moe.variants import load_config
from moe import cli
from moe.errors import ConfigError, UserError
from tests.conftest import REPO


def composed(*overrides):
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def test_default_config_composes_and_validates():
    cfg = load_config(composed())
    assert isinstance(cfg, Config)
    assert cfg.model.router.name == "topk" and cfg.model.n_experts == 8 and cfg.data.name == "pystdlib"


def test_overrides_reach_the_dataclasses():
    cfg = load_config(composed("model.n_experts=16", "router.top_k=4", "optim.lr=3e-4", "train.max_steps=500"))
    assert (cfg.model.n_experts, cfg.model.router.top_k, cfg.optim.lr, cfg.train.max_steps) == (16, 4, 3e-4, 500)


@pytest.mark.parametrize("overrides,match", [
    (["router.top_k=9"], r"router.top_k=9 must be <= model.n_experts=8"),
    (["model.n_heads=4", "model.n_kv_heads=3"], r"model.n_heads=4 must be divisible by model.n_kv_heads=3"),
    (["model.d_model=-8"], r"model.d_model=-8 must be > 0"),
    (["train.batch_size=0"], r"train.batch_size=0 must be > 0"),
    (["train.dtype=fp8"], r"train.dtype='fp8' is not allowed; choose one of \['auto', 'fp32', 'bf16'\]"),
    (["train.batch_size=10", "train.grad_accum=3"], r"train.batch_size=10 must be divisible by train.grad_accum=3"),
    (["train.seq_len=1024"], r"train.seq_len=1024 is beyond model.max_seq_len=256 .*model.rope_scaling"),
])
def test_bad_values_name_the_field(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(composed(*overrides))


def test_variant_names_are_checked_once_by_their_registry():
    """The schema does not know the variants: `router.name=nope` passes the schema's `load_config` and
    is refused by the registry that owns router names: when the config is resolved (`moe.variants`),
    at start-up (`check_variants`) and when building."""
    from moe.model import Transformer, check_variants
    cfg = schema.load_config(composed("router.name=nope"))
    with pytest.raises(ConfigError, match=r"router.name='nope' is unknown; choose one of \[.*'topk'"):
        check_variants(cfg.model)
    with pytest.raises(ConfigError, match=r"^router.name='nope' is unknown"):
        load_config(composed("router.name=nope"))
    cfg.model.vocab_size = 64
    with pytest.raises(ConfigError, match=r"router.name='nope' is unknown"):
        Transformer(cfg.model)
    for field in ("attention", "experts"):
        cfg = schema.load_config(composed(f"{field}.name=nope"))
        with pytest.raises(ConfigError, match=rf"{field}.name='nope' is unknown"):
            check_variants(cfg.model)


def test_an_option_the_chosen_variant_lacks_is_one_error_naming_its_options():
    with pytest.raises(ConfigError) as e:
        load_config(composed("router=topk", "+router.sinkhorn_iters=3"))
    assert str(e.value) == ("router.sinkhorn_iters: not an option of router.name='topk'; its options are "
                            f"{ROUTERS.option_names('topk')}")
    for group, name in (("experts", "loop"), ("attention", "eager")):
        with pytest.raises(ConfigError) as e:
            load_config(composed(f"{group}={name}", f"+{group}.block=3"))
        assert str(e.value) == f"{group}.block: not an option of {group}.name={name!r}; it has no options"


def test_the_schema_keeps_variant_options_as_given_until_resolved():
    raw = schema.load_config(composed("router=sinkhorn", "router.sinkhorn_iters=3"))
    assert raw.model.router == schema.VariantConfig("sinkhorn", {**raw.model.router.options, "sinkhorn_iters": 3})
    cfg = load_config(composed("router=sinkhorn", "router.sinkhorn_iters=3"))
    assert (type(cfg.model.router).__qualname__, cfg.model.router.sinkhorn_iters) == ("SinkhornRouter.Config", 3)
    assert schema.to_dict(cfg)["model"]["router"] == {"name": "sinkhorn", **raw.model.router.options}


def test_variant_groups_nest_under_model_and_old_layouts_still_load():
    """`router.*` / `attention.*` / `experts.*` on the command line land in `model.router` etc.; a
    config dict of the old layout (variant sections at the top, as older checkpoints hold) too."""
    cfg = load_config(composed("router=switch", "router.capacity_factor=2.0", "experts=loop", "attention=eager"))
    assert (cfg.model.router.name, cfg.model.router.capacity_factor) == ("switch", 2.0)
    assert (cfg.model.experts.name, cfg.model.attention.name) == ("loop", "eager")
    old = {"model": {"n_experts": 4}, "router": {"name": "hash", "top_k": 1}, "experts": {"name": "loop"}}
    cfg = load_config(old)
    assert (cfg.model.router.name, cfg.model.router.top_k, cfg.model.experts.name) == ("hash", 1, "loop")
    assert "router" not in Config.__dataclass_fields__


def test_unknown_key_is_an_error():
    with pytest.raises(ConfigError, match=r"unknown config key 'model.n_expert'"):
        load_config(composed("+model.n_expert=3"))
    with pytest.raises(ConfigError, match="bad value for 'model.n_layers'"):
        load_config(composed("model.n_layers=many"))


def test_text_data_needs_a_path():
    with pytest.raises(ConfigError, match="data.path"):
        load_config({"data": {"name": "text"}})


def train_py(capsys, tmp_path, *args: str, start: bool = False) -> tuple[int, str]:
    """A refused `python train.py <args>` in-process: its exit status and stderr. The same steps as
    train.py: the override check of its `__main__`, then in `main` the config load and (start=True)
    `train()`'s start checks, a UserError printed by `cli.fail`. The process around them (exit 2 at
    the interpreter, no traceback, Hydra's directory removed) is one code path for every UserError:
    test_train_py_exits_2_with_one_line_and_no_traceback runs it through the real command."""
    from moe.train import JobInfo, train  # lazy, as in train.py

    args = (*args, "logger=none")
    with pytest.raises(SystemExit) as exited:
        cli.check_hydra_overrides(REPO / "configs", "config", list(args))
        try:
            cfg = load_config(composed(*args))
            if start:
                train(cfg, tmp_path / "run", JobInfo(overrides=list(args)))
        except UserError as e:
            cli.fail(e)
    return exited.value.code, capsys.readouterr().err


def test_train_py_exits_2_with_one_line_and_no_traceback(tmp_path):
    """The one real process: a refusal inside Hydra's main is exit 2, one line, no traceback."""
    run_dir = tmp_path / "run"
    p = subprocess.run([sys.executable, "train.py", "router.top_k=12", f"hydra.run.dir={run_dir}", "logger=none"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == ["error: router.top_k=12 must be <= model.n_experts=8"], p.stderr
    assert "Traceback" not in p.stderr
    assert not run_dir.exists(), "a refused train.py left Hydra's run directory"


def test_train_py_refusals_are_one_clear_line(capsys, tmp_path):
    code, err = train_py(capsys, tmp_path, "router.top_k=12")
    assert code == 2 and "error: router.top_k=12 must be <= model.n_experts=8" in err
    code, err = train_py(capsys, tmp_path, "router=nosuchrouter")
    assert code == 2
    assert err.strip().splitlines() == [
        "error: `router=nosuchrouter`: no such option of the `router` group; "
        "options: aux_free, expert_choice, hash, sinkhorn, switch, topk"]
    for args in (["router=topk", "router.sinkhorn_iters=3"], ["router=topk", "+router.sinkhorn_iters=3"]):
        code, err = train_py(capsys, tmp_path, *args)  # another router's option: the override check, or topk's Config
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert err.startswith(("error: `router.sinkhorn_iters` is a key of `router=sinkhorn`",
                               "error: router.sinkhorn_iters: not an option of router.name='topk'; its options "
                               "are ['top_k', ")), err
    code, err = train_py(capsys, tmp_path, "model.n_expert=16")  # a typo in a key: one line, a suggestion, the keys
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: unknown config key `model.n_expert`; did you mean `model.n_experts`")
    assert "valid keys of `model`: vocab_size, d_model," in err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="both variants can run on a CUDA machine")
def test_variant_that_cannot_run_here_fails_before_any_work(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("MOE_LAB_CACHE", "/nonexistent/never-used")  # data preparation must not even start
    code, err = train_py(capsys, tmp_path, "experts=triton", "train.device=cpu", start=True)
    assert code == 2
    assert "error: experts.name='triton'" in err and "TRITON_INTERPRET=1" in err
    code, err = train_py(capsys, tmp_path, "attention=flash", start=True)
    assert code == 2 and "attention.name='flash'" in err
    assert not (tmp_path / "run").exists()


# One rejected value for every numeric field of the schema (the test below fails when a field is
# added without one, or when a value here is accepted). Keys are the names the command line uses.
BAD_VALUES = {
    "model.vocab_size": 0, "model.d_model": 0, "model.n_layers": 0, "model.n_heads": -1, "model.n_kv_heads": 0,
    "model.head_dim": -2, "model.q_lora_rank": 0, "model.kv_lora_rank": 0, "model.qk_nope_head_dim": 0,
    "model.qk_rope_head_dim": 0, "model.v_head_dim": 0, "model.routed_scaling_factor": 0.0, "model.max_seq_len": 0, "model.rope_theta": 0.0, "model.norm_eps": -1e-5,
    "model.n_experts": 0, "model.expert_hidden": 0, "model.n_shared_experts": -1, "model.n_dense_layers": -1,
    "model.dense_hidden": 0, "model.init_std": float("nan"),
    "router.top_k": 0, "router.aux_loss_coef": -0.01, "router.z_loss_coef": float("inf"),
    "router.temperature": 0.0, "router.jitter": 1.0, "router.capacity_factor": 0.0, "router.bias_update_rate": -1.0,
    "router.seq_aux_loss_coef": -1.0, "router.sinkhorn_iters": 0, "router.n_groups": 0, "router.topk_groups": 0,
    "router.group_score_top": 0,
    "data.vocab_size": 0, "data.tokenizer_train_chars": 0, "data.val_fraction": 1.0, "data.max_chars": 0,
    "data.num_proc": 0, "data.shard_tokens": 0,
    "optim.lr": 0.0, "optim.min_lr_ratio": 1.5, "optim.warmup_steps": -1, "optim.weight_decay": -0.1,
    "optim.beta1": 1.0, "optim.beta2": -0.5, "optim.eps": 0.0, "optim.grad_clip": -1.0,
    "train.batch_size": 0, "train.seq_len": 0, "train.grad_accum": 0, "train.max_steps": 0, "train.stop_after": 0,
    "train.log_interval": 0, "train.eval_interval": 0, "train.eval_batches": 0, "train.ckpt_interval": 0,
    "train.keep_last": 0, "train.peak_flops": 0.0,
    "train.profile.wait": -1, "train.profile.warmup": -1, "train.profile.active": 0, "train.profile.repeat": -1,
    "train.profile.top_ops": 0,
    "monitor.token_entropy_high": 0.0, "monitor.load_entropy_low": -0.1, "monitor.patience": 0,
    "monitor.start_step": -1, "monitor.dead_experts": -1, "monitor.load_imbalance_high": -1.0,
    "distributed.ep_size": 0, "distributed.timeout_s": 0, "distributed.ep_grad_bucket_mb": -1.0,
    "model.clip_qkv": 0.0, "model.shared_expert_hidden": 0, "model.sliding_window": 0, "model.swiglu_alpha": 0.0,
    "model.swiglu_limit": -1.0,
    "cluster.nodes": 0, "cluster.gpus_per_node": -1, "cluster.tasks_per_node": 0, "cluster.cpus_per_task": 0,
    "cluster.mem_gb": 0, "cluster.timeout_min": 0, "cluster.max_requeues": -1, "cluster.signal_delay_s": -1,
    "seed": -1,
    "model.mtp_depth": -1, "train.mtp_loss_coef": -0.1, "train.mtp_loss_coef_after": -0.1,
    "train.mtp_loss_switch_step": 0,
}


def numeric_fields(cls=None, prefix="") -> list[str]:
    """Every int / float field of the schema, recursively, and of every router's own Config, named
    as on the command line (`router.*`)."""
    import dataclasses
    import typing

    if cls is None:
        routers = {f for name in ROUTERS for f in numeric_fields(ROUTERS.options(name), "router.")}
        return numeric_fields(Config) + sorted(routers)
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        if dataclasses.is_dataclass(t):
            out += numeric_fields(t, f"{prefix}{f.name}.")
        elif t in (int, float) or typing.get_args(t) in ((int, type(None)), (float, type(None))):
            out.append(f"{prefix}{f.name}")
    return out


def router_with(option: str) -> str:
    """A router that has `option` (the first, by name)."""
    return next(name for name in ROUTERS if option in ROUTERS.option_names(name))


def test_every_numeric_field_rejects_a_bad_value_naming_the_field():
    fields = numeric_fields()
    assert len(fields) > 50
    assert sorted(BAD_VALUES) == sorted(fields)  # both ways: no field without a bad value, none stale
    for name, bad in BAD_VALUES.items():
        section, _, key = name.rpartition(".")
        raw = {key: bad}
        for part in reversed(section.split(".") if section else []):  # train.profile.wait: nested sections
            raw = {part: raw}
        if section == "router":
            raw["router"]["name"] = router_with(key)
        with pytest.raises(ConfigError) as e:
            load_config(raw)
        assert str(e.value).startswith(f"{name}={bad!r}") and "\n" not in str(e.value), (name, str(e.value))


def test_new_checks_reach_the_command_line(capsys, tmp_path):
    code, err = train_py(capsys, tmp_path, "optim.beta2=1.5")
    assert code == 2 and err.strip() == "error: optim.beta2=1.5 must be in [0.0, 1.0)"
    code, err = train_py(capsys, tmp_path, "monitor.patience=0")
    assert code == 2 and "error: monitor.patience=0 must be > 0" in err
    with pytest.raises(ConfigError, match="train.resume_allow: 'optim.lrr' is not a config field"):
        load_config({"train": {"resume_allow": ["optim.lrr"]}})
    assert load_config({"train": {"resume_allow": ["router.top_k", "optim", "train.max_steps"]}})


# The parameter counts in the comments of configs/model/*.yaml are what the model reports.
MODELS = sorted((REPO / "configs" / "model").glob("*.yaml"))


@pytest.mark.parametrize("path", MODELS, ids=[p.stem for p in MODELS])
def test_comment_states_the_parameter_counts(path):
    header = " ".join(line.lstrip("# ") for line in path.read_text().splitlines() if line.startswith("#"))
    m = re.search(r"([\d.]+)M parameters, ([\d.]+)M active per token.*? at a (\d+)-token vocabulary", header)
    assert m, f"{path.name}: the comment must state 'NM parameters, NM active per token ... at a N-token vocabulary'"
    total, active, vocab = float(m.group(1)), float(m.group(2)), int(m.group(3))
    from moe.model import Transformer
    raw = OmegaConf.to_container(OmegaConf.load(path))
    raw["vocab_size"] = vocab
    with torch.device("meta"):  # counts without allocating the 0.5B-parameter model
        model = Transformer(load_config({"model": raw}).model)
    assert round(model.num_params() / 1e6, 2) == total
    assert round(model.num_params(active=True) / 1e6, 2) == active


def test_rope_scaling_from_the_command_line_extends_the_context():
    cfg = load_config(composed("model.rope_scaling={rope_type: yarn, factor: 4.0, original_max_position_embeddings: 256}",
                               "train.seq_len=512"))
    assert cfg.model.rope_scaling == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}
    assert cfg.model.max_context == 1024 and load_config(composed()).model.rope_scaling is None

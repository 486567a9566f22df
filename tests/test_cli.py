"""Every entry point: a user error is one line `error: ...` on stderr and exit status 2, and a
misspelled Hydra override gets a suggestion naming what to type (moe/cli.py)."""

from __future__ import annotations

import pytest

from moe import cli
from moe.errors import ConfigError
from tests.conftest import REPO

CONFIGS = REPO / "configs"


@pytest.mark.parametrize("config, argv, expected", [
    # a typo in a key: the closest keys of its section, and all of them
    ("config", ["model.n_expert=16"], "unknown config key `model.n_expert`; did you mean `model.n_experts` or "
     "`model.n_shared_experts`? valid keys of `model`: vocab_size, d_model, n_layers,"),
    # the model config owns the router, but the command line says `router.top_k`
    ("config", ["model.router.top_k=4"], "unknown config key `model.router.top_k`; did you mean `router.top_k`?"),
    ("config", ["train.lr=1e-3"], "unknown config key `train.lr`; did you mean `optim.lr`?"),
    ("config", ["modle=small"], "unknown config key `modle`; did you mean `model`? valid keys at the top level: "
     "model, router,"),
    # a misspelled group option, also inside a sweep
    ("config", ["model=smal"], "`model=smal`: no such option of the `model` group; did you mean `model=small`? "
     "options: base, mla_tiny, small, tiny"),
    ("config", ["-m", "router=topk,swich", "seed=0,1"], "`router=swich`: no such option of the `router` group; "
     "did you mean `router=switch`?"),
    # a key of another option of the group
    ("config", ["data.path=x.txt"], "`data.path` is a key of `data=chat` and `data=text`, not of the chosen option; "
     "choose it first: `data=chat data.path=...`"),
    ("config", ["seed.value=1"], "`seed.value`: `seed` is a value, not a section"),
    # python -m eval: the task group's keys land in `eval.*`
    ("eval", ["task=truthfulqa", "eval.limt=5"], "unknown config key `eval.limt`; did you mean `eval.limit`?"),
    ("eval", ["task=mt_bnch"], "`task=mt_bnch`: no such option of the `task` group; did you mean `task=mt_bench`?"),
    ("eval", ["eval.max_new_tokens=8"], "`eval.max_new_tokens` is a key of `task=mt_bench` and "
     "`task=sampling_sweep`"),
])
def test_a_typo_gets_a_suggestion_of_what_to_type(config, argv, expected):
    with pytest.raises(ConfigError) as e:
        cli._check_hydra_overrides(CONFIGS, config, argv)
    assert str(e.value).startswith(expected), str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("config, argv", [
    ("config", ["router.top_k=4", "model=small", "experts=loop", "router=aux_free", "router.bias_update_rate=0.01"]),
    ("config", ["-m", "router=topk,switch", "router.top_k=1,2", "seed=0,1"]),
    ("config", ["data=text", "data.path=x.txt", "monitor.patience=2", "logger.tags=[a,b]", "hydra.run.dir=/tmp/x"]),
    ("config", ["+model.extra=1", "~seed", "train.resume=auto"]),  # Hydra's and the schema's to judge
    ("eval", ["task=mt_bench", "ckpt=x", "eval.max_new_tokens=8", "judge=openai", "judge.base_url=http://h/v1"]),
])
def test_correct_overrides_pass(config, argv):
    cli._check_hydra_overrides(CONFIGS, config, argv)


def test_a_typo_exits_2_with_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        cli.check_hydra_overrides(CONFIGS, "config", ["model=smal"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: `model=smal`") and err.count("\n") == 1


def _one_line_exit_2(main, argv, capsys, *expected):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for text in expected:
        assert text in err, err


def test_argparse_clis_print_one_line_and_return_2_on_user_errors(tmp_path, capsys):
    from benchmarks import ep_alltoall, moe_layer, sweep_report
    from benchmarks import generate as bench_generate
    from benchmarks.serving import cli as serving_cli
    from moe import generate
    from moe.serve import __main__ as serve

    empty = str(tmp_path)  # a directory without checkpoints
    _one_line_exit_2(generate.main, [empty, "--prompt", "hi"], capsys, "no checkpoint found")
    _one_line_exit_2(serve.main, [empty, "--port", "0"], capsys, "no checkpoint found")
    _one_line_exit_2(bench_generate.main, ["--checkpoint", empty], capsys, "no checkpoint found")
    _one_line_exit_2(sweep_report.main, [empty], capsys, "no run directories")
    _one_line_exit_2(moe_layer.main, ["--shapes", "huge"], capsys, "unknown shape 'huge'")
    _one_line_exit_2(ep_alltoall.main, ["--dispatch", "bogus"], capsys, "experts.name='bogus' is unknown")
    _one_line_exit_2(ep_alltoall.main, ["--experts", "7", "--nproc", "2"], capsys, "must be divisible by the 2")
    _one_line_exit_2(serving_cli.main, ["--base-url", "http://example.com/v1", "--out-dir", empty], capsys,
                     "is not a loopback address")


def test_guarded_keeps_bugs_loud():
    @cli.guarded
    def main():
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        main()


def test_one_line_joins_multi_line_messages():
    assert cli.one_line(ConfigError("bad config:\n  model.a: 1 vs 2\n  model.b: 3 vs 4")) == \
        "bad config:; model.a: 1 vs 2; model.b: 3 vs 4"


def test_engine_commands_say_what_they_run_with(tmp_path, bpe_tokenizer, capsys):
    """moe.generate (and moe.serve, through the same line) print the quantization, KV cache dtype
    and routing at start-up, so `--router-top-k 1` or `--quantization int4` is confirmed."""
    from moe import generate
    from moe.engine import LLM
    from tests.hf_fixtures import family_checkpoint

    ckpt = family_checkpoint(tmp_path, bpe_tokenizer, d_model=64, n_heads=4, n_kv_heads=4)
    assert generate.main([str(ckpt), "--prompt", "hi", "--max-tokens", "2", "--router-top-k", "1",
                          "--device", "cpu", "--dtype", "fp32"]) == 0
    err = capsys.readouterr().err
    assert "engine: quantization none; KV cache auto (float32); routing topk top_k=1" in err
    assert "(changed by the command line: top_k=1)" in err
    llm = LLM(str(ckpt), quantization="int8", kv_cache_dtype="fp8_e4m3", device="cpu", dtype="fp32", num_blocks=16)
    line = cli.engine_settings(llm, {})
    assert line.startswith("engine: quantization int8; KV cache fp8_e4m3; routing topk top_k=2")
    assert "(as trained)" in line and line.endswith("float32 on cpu")

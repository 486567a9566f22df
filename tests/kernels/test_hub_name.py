"""`kernels` is both this project's Triton package and Hugging Face's hub-kernels package (which
transformers >= 5.25 imports): both must import (kernels/__init__.py says why and how)."""
import importlib.metadata

import pytest

import kernels

HUB_INSTALLED = kernels._hub_package_dir() is not None


def test_own_subpackages_import():
    import kernels.compile_check
    import kernels.moe_gemm

    assert kernels.moe_gemm.__file__.startswith(kernels.__path__[0])


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_kernel_name"):
        kernels.no_such_kernel_name  # noqa: B018


@pytest.mark.skipif(not HUB_INSTALLED, reason="Hugging Face's `kernels` distribution is not installed")
def test_hub_names_resolve_to_the_hub_package():
    from kernels import CUDAProperties, __version__
    from kernels._internals.layer import CUDAProperties as direct

    assert CUDAProperties is direct
    assert __version__ == importlib.metadata.version("kernels")
    assert kernels.__path__[-1] == str(kernels._hub_package_dir())


@pytest.mark.skipif(not HUB_INSTALLED, reason="Hugging Face's `kernels` distribution is not installed")
def test_transformers_builds_a_model_beside_the_project_kernels():
    transformers = pytest.importorskip("transformers")
    config = transformers.MixtralConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, vocab_size=32,
                                        num_local_experts=2)
    assert transformers.MixtralForCausalLM(config).config.num_local_experts == 2


def test_without_the_hub_distribution_nothing_is_added(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    assert kernels._hub_package_dir() is None


@pytest.mark.skipif(not HUB_INSTALLED, reason="Hugging Face's `kernels` distribution is not installed")
def test_only_the_hub_exports_are_forwarded():
    names = kernels._hub_exports()
    assert {"CUDAProperties", "kernelize", "__version__"} <= names
    assert not hasattr(kernels, "_internals_not_a_name") and "moe_gemm" not in names

"""moe-lab: a Mixture-of-Experts transformer research codebase."""

from moe.config import Config, ConfigError, ModelConfig, RouterConfig

__all__ = ["Config", "ConfigError", "ModelConfig", "RouterConfig", "Transformer", "load_model"]


def __getattr__(name):
    # Lazy so `import moe.config` does not pull in torch-heavy modules.
    if name == "Transformer":
        from moe.model import Transformer
        return Transformer
    if name == "load_model":
        from moe.checkpoint import load_model
        return load_model
    raise AttributeError(name)

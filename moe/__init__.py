"""moe-lab: a Mixture-of-Experts transformer research codebase.

    from moe import load_model, Transformer, Config, ModelConfig
    from moe.engine import LLM, SamplingParams

The layers and what each module may import are in docs/architecture.md.
"""

from moe.config import Config, ModelConfig
from moe.errors import CheckpointError, ConfigError

__all__ = ["CheckpointError", "Config", "ConfigError", "ModelConfig", "RouterConfig", "Transformer", "load_model"]


def __getattr__(name):
    # Deliberately lazy: `import moe.config` (and so `import moe`) must stay cheap and torch-free;
    # the model and the loader pull in torch, the data pipeline and the HF readers.
    if name == "Transformer":
        from moe.model import Transformer  # lazy: see above
        return Transformer
    if name == "RouterConfig":  # the options every router has (moe/routing/routers/base.py)
        from moe.routing.routers.base import RouterConfig  # lazy: see above
        return RouterConfig
    if name == "load_model":
        from moe.loading import load_model  # lazy: see above
        return load_model
    raise AttributeError(name)

"""Small randomly initialised HF models of each family (a pytest plugin, registered in
tests/conftest.py, for the HF, evaluation, engine and server tests), saved with `save_pretrained`
in several shards next to a foreign word-level tokenizer with a chat template. The configs vary
what the general case must cover: GQA ratios, head_dim != hidden / heads, tied and untied
embeddings, renormalised or not, attention biases, OLMoE's clip_qkv, Qwen's sparse-step /
mlp-only layouts and shared expert. Lazy and session-scoped: a directory is made when first asked."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from moe.checkpoint import checkpoint_path, save_checkpoint, tokenizer_files
from moe.config import Config, ModelConfig, TrainConfig, to_dict
from moe.routing.routers import router_config
from moe.model import Transformer

VOCAB = 96

COMMON = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
              num_experts_per_tok=2, max_position_embeddings=128, bos_token_id=None, eos_token_id=None,
              pad_token_id=None, rope_parameters={"rope_type": "default", "rope_theta": 500.0})

# id -> (model_type, config fields beyond COMMON)

CASES = {
    "mixtral-gqa-headdim": ("mixtral", dict(intermediate_size=24, num_local_experts=4, head_dim=12)),
    "mixtral-mha-tied": ("mixtral", dict(intermediate_size=24, num_local_experts=5, num_key_value_heads=4,
                                         tie_word_embeddings=True, num_experts_per_tok=1)),
    "olmoe-gqa1-bias-clip": ("olmoe", dict(intermediate_size=24, num_experts=4, num_key_value_heads=1,
                                           attention_bias=True, clip_qkv=0.9, norm_topk_prob=False)),
    "olmoe-tied-renorm": ("olmoe", dict(intermediate_size=24, num_experts=6, tie_word_embeddings=True,
                                        norm_topk_prob=True, num_experts_per_tok=3)),
    "qwen2-step2-headdim": ("qwen2_moe", dict(intermediate_size=40, moe_intermediate_size=16, num_experts=4,
                                              shared_expert_intermediate_size=24, decoder_sparse_step=2,
                                              head_dim=12, norm_topk_prob=False)),
    "qwen2-mha-tied-mlponly": ("qwen2_moe", dict(intermediate_size=40, moe_intermediate_size=16, num_experts=5,
                                                 shared_expert_intermediate_size=20, num_key_value_heads=4,
                                                 mlp_only_layers=[2], tie_word_embeddings=True, qkv_bias=False,
                                                 norm_topk_prob=True)),
    "qwen3-headdim-mlponly": ("qwen3_moe", dict(intermediate_size=40, moe_intermediate_size=16, num_experts=4,
                                                head_dim=16, mlp_only_layers=[0], norm_topk_prob=True)),
    "qwen3-gqa1-bias-step2-tied": ("qwen3_moe", dict(intermediate_size=40, moe_intermediate_size=16, num_experts=6,
                                                     num_key_value_heads=1, head_dim=8, attention_bias=True,
                                                     decoder_sparse_step=2, tie_word_embeddings=True,
                                                     norm_topk_prob=False, num_experts_per_tok=3)),
    # sliding windows shorter than the test prompts, GPT-OSS's sinks, biases, clamped SwiGLU and YaRN
    "mixtral-window": ("mixtral", dict(intermediate_size=24, num_local_experts=4, sliding_window=5)),
    "qwen2-window": ("qwen2_moe", dict(intermediate_size=40, moe_intermediate_size=16, num_experts=4,
                                       shared_expert_intermediate_size=24, use_sliding_window=True, sliding_window=4,
                                       norm_topk_prob=True)),
    "gpt_oss-gqa-alternating": ("gpt_oss", dict(intermediate_size=16, num_local_experts=4, head_dim=12,
                                                sliding_window=4)),
    "gpt_oss-mha-yarn-tied": ("gpt_oss", dict(
        intermediate_size=12, num_local_experts=5, num_key_value_heads=4, head_dim=16, tie_word_embeddings=True,
        layer_types=["full_attention", "sliding_attention", "sliding_attention"], sliding_window=3,
        num_experts_per_tok=1, swiglu_alpha=1.0, swiglu_limit=0.8,
        rope_parameters={"rope_type": "yarn", "rope_theta": 500.0, "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "truncate": False, "original_max_position_embeddings": 32})),
    "gpt_oss-gqa1-nobias": ("gpt_oss", dict(intermediate_size=16, num_local_experts=6, num_key_value_heads=1,
                                            head_dim=6, attention_bias=False, sliding_window=6,
                                            num_experts_per_tok=3)),
    # DeepSeek's MLA (q_lora_rank None = V2-Lite, set = V2 / V3; nope + rope != v widths), dense first
    # layers, shared experts, routed scaling; V2's greedy and group-limited softmax, V3's sigmoid with a bias
    "deepseek_v2-lite-yarn": ("deepseek_v2", dict(
        intermediate_size=40, moe_intermediate_size=16, n_routed_experts=4, n_shared_experts=1, num_key_value_heads=4,
        q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=12,
        first_k_dense_replace=1, routed_scaling_factor=1.5, topk_method="greedy", norm_topk_prob=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 500.0, "factor": 4.0, "original_max_position_embeddings": 32,
                         "mscale": 0.707, "mscale_all_dim": 0.707, "beta_fast": 32.0, "beta_slow": 1.0})),
    "deepseek_v2-group-qlora": ("deepseek_v2", dict(
        intermediate_size=40, moe_intermediate_size=16, n_routed_experts=8, n_shared_experts=2, num_key_value_heads=4,
        q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=6, v_head_dim=8, first_k_dense_replace=0,
        topk_method="group_limited_greedy", n_group=4, topk_group=2, norm_topk_prob=False, num_experts_per_tok=3)),
    "deepseek_v3-sigmoid-bias-groups": ("deepseek_v3", dict(
        intermediate_size=40, moe_intermediate_size=16, n_routed_experts=8, n_shared_experts=1, num_key_value_heads=4,
        q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6,
        first_k_dense_replace=1, routed_scaling_factor=2.5, n_group=4, topk_group=2, norm_topk_prob=True)),
    "deepseek_v3-nogroup-tied-halfrot": ("deepseek_v3", dict(
        intermediate_size=40, moe_intermediate_size=16, n_routed_experts=6, n_shared_experts=1, num_key_value_heads=4,
        q_lora_rank=None, kv_lora_rank=12, qk_nope_head_dim=6, qk_rope_head_dim=6, v_head_dim=10,
        first_k_dense_replace=0, routed_scaling_factor=1.0, n_group=1, topk_group=1, norm_topk_prob=False,
        rope_interleave=False, tie_word_embeddings=True)),
}

def hf_config(case: str, attn: str = "eager"):
    from transformers import AutoConfig
    model_type, fields = CASES[case]
    return AutoConfig.for_model(model_type, **{**COMMON, **fields}, attn_implementation=attn)

def randomize_(module: torch.nn.Module, seed: int) -> None:
    """Unit-scale random weights (norm gains around 1, biases around 0), so every tensor, the
    rotary and the routing choices move the logits well above the tolerance while they stay O(1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith(".bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            else:  # fan-in scaling: unit-scale activations, router logits and LM logits
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)

def random_hf_model(case: str, seed: int = 0, attn: str = "eager"):
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(case, attn))
    randomize_(model, seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # DeepSeek-V3's selection bias: large enough to change which experts are chosen
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.2 * torch.randn(b.shape, generator=g))
    return model.eval()

def random_ids(batch: int, length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))

def save_word_tokenizer(directory: Path) -> None:
    """A foreign (non-moe-lab) fast tokenizer with a chat template: word-level over VOCAB ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    specials = ["<unk>", "<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"]
    words = [f"w{i}" for i in range(VOCAB - len(specials) - 4)] + ["user", "assistant", "system", "hi"]
    vocab = {t: i for i, t in enumerate(specials + words)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                  pad_token="<pad>", additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    tok.chat_template = ("{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> "
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")
    tok.save_pretrained(str(directory))

@pytest.fixture(scope="session")
def hf_dirs(tmp_path_factory):
    """case -> (directory, the HF model it holds): each saved in shards of ~20 KB, with a tokenizer."""
    made: dict = {}

    def get(case: str):
        if case not in made:
            d = tmp_path_factory.mktemp(case)
            model = random_hf_model(case, seed=len(made) + 1)
            model.save_pretrained(str(d), max_shard_size="20KB")
            save_word_tokenizer(d)
            made[case] = (d, model)
        return made[case]

    return get

def family_checkpoint(run_dir: Path, tokenizer, **model_kw) -> Path:
    """A moe-lab checkpoint (our tokenizer) using family-specific model options."""
    router_kw = model_kw.pop("router", {})
    cfg = Config(model=ModelConfig(**{**dict(vocab_size=VOCAB * 4, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2,
                                             n_experts=4, expert_hidden=16, max_seq_len=64), **model_kw,
                                      "router": router_config(**{"top_k": 2, **router_kw})}),
                 train=TrainConfig(seq_len=32))
    model = Transformer(cfg.model)
    randomize_(model, seed=11)
    return save_checkpoint(checkpoint_path(run_dir, 3), {"model": model.state_dict(), "config": to_dict(cfg),
                                                        "tokenizer": tokenizer_files(tokenizer), "step": 3})

@pytest.fixture(scope="session")
def bpe_tokenizer():
    from moe.data import Tokenizer
    return Tokenizer.train(["the quick brown fox jumps over the lazy dog " * 50], vocab_size=300)

WORDS = [f"w{i}" for i in range(VOCAB - 10)] + ["hi", "user"]

@pytest.fixture(scope="session")
def text_file(tmp_path_factory):
    g = torch.Generator().manual_seed(0)
    lines = [" ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (int(n),), generator=g))
             for n in torch.randint(5, 30, (12,), generator=g)]
    path = tmp_path_factory.mktemp("text") / "doc.txt"
    path.write_text("\n\n".join(lines), encoding="utf-8")
    return path

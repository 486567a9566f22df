"""Fine-tuning an HF model with this trainer equals a plain HF training loop, and the result
exports back as its family.

Parity: a randomly initialised small OLMoE and Qwen3-MoE (tests/hf_fixtures.py), 20 AdamW steps
with this trainer (`train.init_from=<HF dir>`) and with a loop over the transformers model (torch
AdamW, the same parameter groups, warmup + cosine schedule, gradient clipping and batches), both
fp32 from the same weights: every step's loss within 1e-4 relative. The balance loss is off on
both sides (router.aux_loss_coef=0, router.z_loss_coef=0; HF's output_router_logits=False), so
only the LM loss trains. The HF side computes the next-token cross-entropy on the same
(input, target) windows the trainer draws (HF's `labels=` would drop each window's last target).
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from moe.data import TokenBatcher, prepare_data
from moe.hf.commands import export_hf
from moe.loading import load_model
from moe.train.optim import lr_at
from tests.hf_fixtures import random_ids
from tests.train.finetune_helpers import composed, finetune_args, run, word_corpus

STEPS = 20
PARITY_ARGS = ["router.aux_loss_coef=0", "router.z_loss_coef=0", "train.dtype=fp32", "optim.lr=1e-3",
               "optim.warmup_steps=3", "train.eval_interval=100"]
CASES = ["olmoe-gqa1-bias-clip", "qwen3-headdim-mlponly"]


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models (tests/conftest.py)


def hf_loop_losses(hf_dir, args) -> list[float]:
    """The reference: transformers' model trained by a plain loop on the trainer's batches."""
    from transformers import AutoModelForCausalLM
    cfg = composed(args)
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    model.config.output_router_logits = False
    model.train()
    tokenizer = load_model(hf_dir)[1]
    data = prepare_data(cfg.data, tokenizer=tokenizer)
    batcher = TokenBatcher(data.train_tokens(), cfg.train.batch_size, cfg.train.seq_len, seed=cfg.seed)
    o = cfg.optim
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": o.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps)
    losses = []
    for step in range(STEPS):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, o, cfg.train.max_steps)
        x_BT, y_BT = batcher.next_batch()
        logits_BTV = model(input_ids=x_BT).logits
        loss = F.cross_entropy(logits_BTV.float().reshape(-1, logits_BTV.shape[-1]), y_BT.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, o.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses


@pytest.mark.slow  # ~15 s per family on 2 shared cores
@pytest.mark.parametrize("case", CASES)
def test_finetune_equals_a_plain_hf_loop_and_exports_back(hf_dirs, tmp_path, case):
    src, _ = hf_dirs(case)
    corpus = word_corpus(tmp_path)
    args = finetune_args(src, corpus, tmp_path / "cache", *PARITY_ARGS, steps=STEPS)
    run(args, tmp_path / "run")
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    ours = [r["train/loss"] for r in records if "train/loss" in r]
    ref = hf_loop_losses(src, args)
    assert len(ours) == len(ref) == STEPS
    rel = max(abs(a - b) / abs(b) for a, b in zip(ours, ref))
    assert rel <= 1e-4, (rel, ours, ref)
    print(f"{case}: max relative loss difference over {STEPS} steps {rel:.2e}")

    # back out: the fine-tuned run exports as its family, and transformers reads the same logits
    from transformers import AutoConfig, AutoModelForCausalLM
    out = export_hf(tmp_path / "run", tmp_path / "exported")
    assert AutoConfig.from_pretrained(str(out)).model_type == AutoConfig.from_pretrained(str(src)).model_type
    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    mine = load_model(tmp_path / "run", dtype="fp32")[0]
    ids = random_ids(2, 12, seed=5)
    with torch.no_grad():
        a, b = mine(ids).logits, hf(input_ids=ids).logits
    assert (a - b).abs().max() <= 1e-4 * max(1.0, float(b.abs().max())), float((a - b).abs().max())
    assert not torch.allclose(b, AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32).eval()(
        input_ids=ids).logits, atol=1e-3)  # the export holds the fine-tuned weights, not the source's

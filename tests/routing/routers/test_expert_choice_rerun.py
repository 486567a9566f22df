"""The expert-choice router's training path builds its masks and ids on the inputs' device
(docs/results/mutation/rerun2/: the second run's modules re-run; this kills its survivors that make
them on the default device, which a CPU-only run cannot tell apart)."""

import torch

from moe.routing.routers import build_router, router_config


def test_expert_choice_training_path_stays_on_the_inputs_device():
    """On a non-CPU device (meta stands for any) every tensor the training path makes lives there:
    a chosen-mask, an index or an id row made on the default (CPU) device would be mixed with
    the device's scores and fail."""
    r = build_router(router_config("expert_choice", top_k=2), 16, 8)
    torch.nn.init.normal_(r.weight, 0.0, 0.1)
    r = r.to("meta").train()
    out = r(torch.randn(12, 16, device="meta"))
    assert out.experts_TK.shape == (12, 8) and out.weights_TK.shape == (12, 8)
    for t in (out.experts_TK, out.weights_TK, out.probs_TE, out.loss, out.n_dropped):
        assert t.device.type == "meta"

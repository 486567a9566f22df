"""DeepSeek-V3 (`DeepseekV3ForCausalLM`: DeepSeek-V3, R1 and their distillation targets): DeepSeek-V2's
layout (deepseek_v2.py: MLA, first_k_dense_replace dense layers, fine-grained routed + shared
experts, routed_scaling_factor) with V3's routing, transformers' `noaux_tc`: sigmoid affinities,
selection on affinity + `e_score_correction_bias` (our aux_free router's buffer of that name),
within the `topk_group` best of `n_group` groups (a group scored by the sum of its two best biased
affinities: `router.group_score_top=2`), combine weights the unbiased affinities, renormalised
when `norm_topk_prob`; and `rope_interleave` (true in the published configs).

Fine-tuning keeps the aux-loss-free balancing: the bias moves by `router.bias_update_rate`
(0.001, V3's rate) after each step. Multi-token prediction: DeepSeek's checkpoints store
`num_nextn_predict_layers` MTP layers after the last decoder layer (`model.layers.{n}`), which
transformers drops. We read the ones a directory's files hold into `model.mtp_depth` modules
(moe/mtp.py; tensor names in moe/hf/tensor_map.py `_nextn_rows`), so an imported V3 drafts for
itself (`speculative="mtp"`) and fine-tunes its MTP loss; a directory without them (what
transformers' `save_pretrained` writes) loads as the main model alone. Export writes them back
and states their number.
"""

from __future__ import annotations

from typing import Any

from transformers import DeepseekV3Config

from moe.config import ModelConfig
from moe.hf.families.base import FAMILIES
from moe.hf.families.deepseek_v2 import DeepseekV2
from moe.routing.routers import router_config

V3_BIAS_UPDATE_RATE = 0.001  # gamma of the DeepSeek-V3 report, section 2.1.2 (its first 14.3T tokens)


@FAMILIES.register("deepseek_v3")
class DeepseekV3(DeepseekV2):
    model_type = "deepseek_v3"
    display_name = "DeepSeek-V3"
    architecture = "DeepseekV3ForCausalLM"
    config_class = DeepseekV3Config
    mapped = DeepseekV2.mapped | {"rope_interleave", "num_nextn_predict_layers"}
    topk_methods = ("noaux_tc",)
    scoring = "sigmoid"

    def router_config(self, c, fields: dict[str, Any]):
        return router_config("aux_free", top_k=c.num_experts_per_tok, renormalize=fields.pop("renormalize"),
                             aux_loss_coef=getattr(c, "router_aux_loss_coef", 0.0), z_loss_coef=0.0,
                             score_func="sigmoid", bias_update_rate=V3_BIAS_UPDATE_RATE,
                             n_groups=c.n_group or 1, topk_groups=c.topk_group or 1, group_score_top=2)

    def input_refusals(self, c) -> list:
        E = c.n_routed_experts
        per_group = E // (c.n_group or 1)
        return super().input_refusals(c) + [
            ((c.n_group or 1) > 1 and per_group < 2, "n_group", c.n_group,
             "noaux_tc scores a group by its two best experts: a group needs two"),
        ]

    def router_refusals(self, m: ModelConfig) -> list:
        r = m.router
        return [
            (r.name != "aux_free", "router.name", r.name, "DeepSeek-V3 routes with noaux_tc ('aux_free')"),
            (getattr(r, "score_func", None) != "sigmoid", "router.score_func", getattr(r, "score_func", None),
             "DeepSeek-V3 scores experts with a sigmoid"),
            (getattr(r, "n_groups", 1) > 1 and getattr(r, "group_score_top", 1) != 2, "router.group_score_top",
             getattr(r, "group_score_top", None), "DeepSeek-V3 scores a group by its two best experts"),
            *self.shared_router_refusals(m),
        ]

    def hf_fields(self, m: ModelConfig) -> dict[str, Any]:
        r = m.router
        # Without MTP layers the field keeps its value (transformers' default 1 states layers its
        # own save_pretrained never writes, and a checkpoint's own value is kept on re-export).
        mtp = {"num_nextn_predict_layers": m.mtp_depth} if m.mtp_depth else {}
        return dict(**self.shared_hf_fields(m), n_group=r.n_groups, topk_group=r.topk_groups,
                    norm_topk_prob=bool(r.renormalize), rope_interleave=bool(m.rope_interleave), **mtp)

    def stored_mtp_depth(self, c, stored_names: set) -> int:
        depth = 0
        while depth < (getattr(c, "num_nextn_predict_layers", 0) or 0) and \
                f"model.layers.{c.num_hidden_layers + depth}.eh_proj.weight" in stored_names:
            depth += 1
        return depth

"""The config schema: one dataclass per section, each module reading its own."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

VARIANT_GROUPS = ("router", "attention", "experts")


@dataclass
class VariantConfig:
    """A variant choice of the model (`router`, `attention`, `experts`): the `name` its registry
    checks, and the options given for it, as given. The schema knows no variant: resolving the
    model config (moe/variants.py) merges `options` onto the chosen variant's own `Config` dataclass,
    which refuses an option the variant does not have, checks the values (its `check_model`) and
    takes this section's place (with the same `name`). A variant without options stays a
    VariantConfig with no options. On disk and on the command line a section is flat:
    `router.name`, `router.top_k`, ... (`to_dict`, `load_config`)."""

    name: str = ""
    options: dict = field(default_factory=dict)


@dataclass
class AttentionConfig(VariantConfig):
    name: str = "sdpa"  # eager (reference) | sdpa | flash (CUDA + flash-attn)


@dataclass
class ExpertsConfig(VariantConfig):
    name: str = "sorted"  # loop (reference) | sorted (grouped matmul) | sorted_fused | triton


@dataclass
class ModelConfig:
    """Decoder-only MoE transformer (Mixtral layout when no Mixtral-foreign option is set)."""

    vocab_size: Optional[int] = None  # None = the tokenizer's size
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: Optional[int] = None  # None = d_model // n_heads
    qkv_bias: bool = False  # biases on the q/k/v projections (Qwen2-MoE)
    attn_out_bias: bool = False  # a bias on the attention output projection (OLMoE/Qwen3 attention_bias)
    # RMSNorm on queries and keys before rotary: "full" = over the whole q / k projection output
    # (OLMoE), "head" = over each head's head_dim (Qwen3); "none" = no norm.
    qk_norm: str = "none"
    clip_qkv: Optional[float] = None  # clamp q, k, v to [-clip_qkv, clip_qkv] after the qk-norm (OLMoE)
    # Per-layer attention: each layer is "full" (causal) or "sliding" (causal, and a query sees only
    # the last `sliding_window` positions, itself included, as HF's sliding-window mask). None =
    # every layer sliding when sliding_window is set (Mixtral), else every layer full.
    layer_types: Optional[list] = None
    sliding_window: Optional[int] = None
    # A learned logit per query head in the softmax denominator, with no value (GPT-OSS's sinks):
    # attention may give part of its mass to "nothing".
    attention_sinks: bool = False
    # "mha" = the grouped-query attention above; "mla" = DeepSeek-V2/V3's Multi-head Latent Attention
    # (moe/attention/mla.py): keys and values from a `kv_lora_rank` latent, queries from a `q_lora_rank`
    # latent (None: one projection, V2-Lite), each head's q/k = `qk_nope_head_dim` dims without rotary +
    # `qk_rope_head_dim` rotary dims (the rotary key is one per token, shared by the heads), values
    # `v_head_dim` wide; `rope_interleave` rotates (even, odd) pairs as DeepSeek's checkpoints expect.
    # A field of its own, not `attention=`: that group chooses the backend that computes the softmax.
    attention_kind: str = "mha"
    q_lora_rank: Optional[int] = None
    kv_lora_rank: Optional[int] = None
    qk_nope_head_dim: Optional[int] = None
    qk_rope_head_dim: Optional[int] = None
    v_head_dim: Optional[int] = None
    rope_interleave: bool = False
    max_seq_len: int = 256
    rope_theta: float = 10000.0
    # RoPE scaling as HF's `rope_parameters` state it, without rope_theta: None = none (the plain
    # rotary), else {"rope_type": linear | dynamic | yarn | llama3, "factor": ..., ...} with the
    # keys that type reads (moe/rope.py; checked by validate_model). With it the model serves up
    # to `max_context` tokens; without it, up to max_seq_len (the trained length).
    rope_scaling: Optional[dict] = None
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    n_experts: int = 8
    expert_hidden: int = 256  # SwiGLU hidden size of one expert
    # The experts' activation: "swiglu" = silu(gate) * up; "clamped_swiglu" (GPT-OSS) = gate
    # clamped above at swiglu_limit, up clamped to +-swiglu_limit, then
    # (up + 1) * gate * sigmoid(swiglu_alpha * gate).
    expert_activation: str = "swiglu"
    swiglu_alpha: float = 1.702  # read only by clamped_swiglu
    swiglu_limit: float = 7.0  # read only by clamped_swiglu
    expert_bias: bool = False  # biases on the experts' gate/up and down projections (GPT-OSS)
    router_bias: bool = False  # a bias on the router's gate logits (GPT-OSS)
    routed_scaling_factor: float = 1.0  # the routed experts' combine weights times this (DeepSeek-V2/V3)
    n_shared_experts: int = 0  # always-on experts (DeepSeekMoE); 0 = none
    shared_expert_hidden: Optional[int] = None  # SwiGLU hidden of the shared FFN; None = n_shared_experts * expert_hidden
    shared_expert_gate: bool = False  # scale the shared FFN by sigmoid(x @ w_gate) per token (Qwen2-MoE)
    n_dense_layers: int = 0  # the first n layers use a dense SwiGLU FFN instead of MoE
    dense_layers: list = field(default_factory=list)  # more dense layers, by index (Qwen's mlp_only_layers / sparse step)
    dense_hidden: Optional[int] = None  # None = expert_hidden * top_k
    init_std: float = 0.02
    # Multi-token prediction (DeepSeek-V3, moe/mtp.py): D sequential modules after the last block; depth k
    # predicts token t+k+1 in training (train.mtp_loss_coef) and drafts for speculative="mtp" in the engine.
    mtp_depth: int = 0
    # The model's variant choices (top-level `router=` / `attention=` / `experts=` groups on the CLI):
    # a VariantConfig until resolved, then the variant's own Config (the router's: top_k, ...).
    router: Any = field(default_factory=lambda: VariantConfig(name="topk"))
    attention: Any = field(default_factory=AttentionConfig)
    experts: Any = field(default_factory=ExpertsConfig)

    @property
    def resolved_head_dim(self) -> int:
        """The per-head width of attention's keys and values; with MLA the wider of the query/key
        head (nope + rope) and the value head: what the engine's expanded KV cache stores per head."""
        if self.attention_kind == "mla":
            return max(self.qk_nope_head_dim + self.qk_rope_head_dim, self.v_head_dim)
        return self.head_dim or self.d_model // self.n_heads

    @property
    def rotary_dim(self) -> int:
        """The dims the rotary turns per head: the whole head, or MLA's `qk_rope_head_dim`."""
        return self.qk_rope_head_dim if self.attention_kind == "mla" else self.resolved_head_dim

    @property
    def max_context(self) -> int:
        """The longest context the rotary is meant for: max_seq_len without rope scaling; with
        it, also factor x the pretrained length (`original_max_position_embeddings`, else
        max_seq_len), as vLLM sizes its scaled rotary caches (Qwen3's YaRN: 4 x 32768)."""
        s = self.rope_scaling
        if not s:
            return self.max_seq_len
        original = s.get("original_max_position_embeddings") or self.max_seq_len
        return max(self.max_seq_len, int(float(s.get("factor") or 1.0) * original))

    @property
    def dense_layer_ids(self) -> list[int]:
        """Indices of the layers with a dense FFN: the first `n_dense_layers` and `dense_layers`."""
        return sorted(set(range(self.n_dense_layers)) | {int(i) for i in self.dense_layers})

    def layer_window(self, layer_idx: int) -> Optional[int]:
        """The sliding window of layer `layer_idx`, None for a full-attention layer."""
        if self.layer_types is None:
            return self.sliding_window
        return self.sliding_window if self.layer_types[layer_idx] == "sliding" else None

    def is_moe_layer(self, layer_idx: int) -> bool:
        return layer_idx not in self.dense_layer_ids

    @property
    def resolved_shared_hidden(self) -> int:
        """SwiGLU hidden size of the shared-expert FFN (0 when there is none)."""
        if not self.n_shared_experts:
            return 0
        return self.shared_expert_hidden or self.n_shared_experts * self.expert_hidden


@dataclass
class DataConfig:
    name: str = "pystdlib"  # pystdlib | text | hub | chat
    # data=text: a file, a glob or a list of them. A .txt file is one document; a corpus of
    # a single document is split head (train) / tail (validation).
    path: Any = None
    text_field: str = "text"  # column holding the text in .jsonl / .parquet / hub data
    hub_name: Optional[str] = None
    hub_config: Optional[str] = None
    hub_split: str = "train"
    vocab_size: int = 4096  # byte-level BPE size (ignored when tokenizer_path is given)
    tokenizer_path: Optional[str] = None  # an existing tokenizer.json instead of training
    tokenizer_train_chars: int = 5_000_000  # BPE is trained on at most this many characters
    val_fraction: float = 0.05
    max_chars: Optional[int] = None  # cap on the corpus size (None = everything)
    streaming: bool = False  # read the corpus as a stream (hub: no full download first; moe/data/streaming.py)
    num_proc: Optional[int] = None  # tokenising processes; None = the CPU cores this process may use
    cache_dir: str = "~/.cache/moe-lab/data"  # a warning when under the home directory (often small, quota'd)
    shard_tokens: int = 2**28  # tokens per token file (512 MiB at uint16); a split is several files plus an index
    packing: bool = True  # data=chat: several conversations per row with a document mask (false: one per row, padded)


@dataclass
class OptimConfig:
    name: str = "adamw"
    lr: float = 3e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 20  # capped at max_steps // 4 (moe/train/optim.py: short runs still decay)
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # 0 = off
    impl: str = "auto"  # auto | fused | foreach | for_loop


@dataclass
class ProfileConfig:
    """torch.profiler over training steps (moe/train/profile.py; docs/guides/profiling.md): per
    rank, Chrome traces, a memory record and the top operators and stage times, in <run dir>/profile/.
    The window is torch.profiler.schedule's, counted in this process's steps (from the resumed step)."""

    enabled: bool = False
    wait: int = 5  # steps skipped before each window (the first steps are slower: allocation, warm caches)
    warmup: int = 1  # steps run under the profiler but not kept (its start-up cost lands there)
    active: int = 3  # steps recorded per window
    repeat: int = 1  # windows; 0 = one every wait+warmup+active steps until the run ends
    top_ops: int = 15  # operators listed in the console, W&B and summary.json
    memory: bool = True  # a memory record per window (CUDA: allocator snapshot; CPU: allocations per operator)


@dataclass
class TrainConfig:
    batch_size: int = 16  # sequences per optimizer step (before accumulation split)
    seq_len: int = 128
    grad_accum: int = 1  # micro-batches per step; batch_size must divide by it
    max_steps: int = 300  # length of the lr schedule
    stop_after: Optional[int] = None  # stop cleanly after this step, as a preemption would
    log_interval: int = 10
    eval_interval: int = 100
    eval_batches: int = 8
    ckpt_interval: int = 100
    keep_last: int = 2
    resume: Optional[str] = None  # None | auto | a checkpoint path
    dtype: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU) | fp32 | bf16 (autocast); moe.perf.device_defaults
    tf32: bool = True  # on CUDA, fp32 matmuls may use TF32 tensor cores (torch's own default is off)
    compile: bool = False
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    peak_flops: Optional[float] = None  # one device's FLOP/s for MFU; None = datasheet or cached peak (moe/perf.py)
    resume_allow: list = field(default_factory=list)  # fields / sections a resume may change on purpose
    overwrite: bool = False  # a fresh run into a used directory moves the old run aside into a dated subfolder
    stop_on_nan: bool = True  # a non-finite loss stops the run with a checkpoint of the last good step
    exit_zero_on_signal: bool = False  # SIGINT/SIGTERM stop with exit code 0 instead of 130/143
    # none | full: recompute each transformer block's activations in backward (moe/train/activation_checkpointing.py)
    activation_checkpointing: str = "none"
    # Fine-tuning (moe/train/init_from.py, docs/guides/finetune.md): start from the weights, model config and
    # tokenizer of a run directory, a checkpoint (.pt or DCP directory) or an HF directory; step 0, fresh optimizer.
    init_from: Optional[str] = None
    trainable: list = field(default_factory=list)  # fnmatch globs over parameter names; [] = all; the rest frozen
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    # The MTP loss weight lambda (model.mtp_depth > 0): loss = main + lambda / D * sum_k CE_k. DeepSeek-V3's
    # schedule is 0.3, then 0.1 from a switch step: mtp_loss_coef_after (None: no switch) at mtp_loss_switch_step.
    mtp_loss_coef: float = 0.0
    mtp_loss_coef_after: Optional[float] = None
    mtp_loss_switch_step: Optional[int] = None


@dataclass
class LoggerConfig:
    name: str = "wandb"  # wandb | none
    project: str = "moe-lab"
    mode: Optional[str] = None  # offline (default) | online | disabled; WANDB_MODE wins
    group: Optional[str] = None
    tags: list = field(default_factory=list)
    run_name: Optional[str] = None


@dataclass
class MonitorConfig:
    """Per-layer routing alerts (moe/routing/monitor.py); values chosen on recorded healthy and collapsed
    runs (docs/design/routing_monitor.md). 0 turns a check off (token_entropy_high: a value above 1)."""

    dead_experts: int = 1  # this many experts of a layer with no token in a log window: dead experts
    load_imbalance_high: float = 3.0  # a layer's max/mean expert load above this: tokens pile onto few experts
    load_entropy_low: float = 0.8  # a layer's normalised load entropy below this: collapse
    token_entropy_high: float = 0.995  # a layer's normalised token entropy above this: not learning
    patience: int = 3  # consecutive log steps beyond a threshold before warning
    start_step: int = 50  # routers start near uniform and unbalanced: no verdict before this step


@dataclass
class DistributedConfig:
    """Multi-process training on torch.distributed (`moe/distributed/`, launched by torchrun)."""

    name: str = "none"  # none (one process) | ddp | fsdp (FSDP2 per block) | ep (expert parallel)
    backend: str = "auto"  # auto = nccl on CUDA, gloo on CPU | nccl | gloo
    ep_size: int = 1  # distributed=ep: ranks that share one copy of the experts (n_experts / ep_size each)
    fsdp: bool = False  # distributed=ep: shard the non-expert parameters with FSDP2 (else DDP)
    mixed_precision: str = "auto"  # FSDP2 params: auto (bf16 on CUDA with train.dtype=bf16) | bf16 | fp32
    reshard_after_forward: bool = True  # FSDP2: free gathered block weights after forward (ZeRO-3)
    global_balance: bool = True  # router balance loss over the global batch (all-reduced f_i, P_i)
    timeout_s: int = 1800  # collective timeout
    # distributed=ep: expert gradients are summed over their replicas in buckets this big (0 = one buffer)
    ep_grad_bucket_mb: float = 25.0


@dataclass
class ClusterConfig:
    """Resources of each job when a sweep runs through a submitit launcher (`hydra/launcher=submitit_slurm`
    or `submitit_local`; moe/cluster/, docs/guides/cluster.md). The trainer does not read them: the launcher does,
    in the submitting process, through `hydra.launcher.*` interpolations. They are part of the schema so
    a bad value is a start-up error like any other, and `config.json` records where a run ran."""

    nodes: int = 1
    gpus_per_node: int = 1
    tasks_per_node: int = 1  # training processes per node: one per GPU (configs/cluster/default.yaml)
    cpus_per_task: int = 8
    mem_gb: Optional[int] = None  # memory per node in GB; None = the partition's default
    timeout_min: int = 240  # time limit of one job (each requeue gets it again)
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    constraint: Optional[str] = None
    max_requeues: int = 3  # requeues after a time limit (preemptions do not count)
    signal_delay_s: int = 120  # the preemption signal comes this long before the time limit
    setup: list = field(default_factory=list)  # shell lines run before srun
    dry_run: bool = False  # write and print the submission, submit nothing

    @property
    def processes(self) -> int:
        """Training processes of one job (its torch.distributed world size)."""
        return self.nodes * self.tasks_per_node


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    seed: int = 0

#!/bin/bash
# run7_mutP: the changed functions of 21c6df3, smallest groups first, each through drive.py (one process at a time)
export OMP_NUM_THREADS=1 MOE_LAB_DATA=/work/shared/data WANDB_MODE=offline HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
cd /work/mut_mutP/mutants
cat /proc/loadavg > load_chain_start.txt; date -u >> load_chain_start.txt
nice -n 5 python drive.py run_small.json "moe.attention.paged_torch_decode.xǁDecodePlanǁ" \
  "moe.attention.paged_torch.xǁTorchPagedAttentionǁplan_decode__" "moe.attention.paged_torch.xǁTorchPagedAttentionǁdecode__" \
  "moe.attention.paged_torch.x_contiguous_span__" "moe.engine.sampling.sampler.x_row_argmax__" \
  "moe.engine.sampling.sampler.x_finite_rows__" "moe.engine.runner.decode_experts.x_one_token_experts__" 2> run_small.log
nice -n 5 python drive.py run_contig.json "moe.attention.paged_torch.x_decode_contiguous__" 2> run_contig.log
nice -n 5 python drive.py run_attend.json "moe.engine.runner.context.xǁPagedKVContextǁattend__" 2> run_attend.log
nice -n 5 python drive.py run_gathered.json "moe.attention.paged_torch_decode.x_decode_gathered__" 2> run_gathered.log
cat /proc/loadavg > load_chain_end.txt; date -u >> load_chain_end.txt

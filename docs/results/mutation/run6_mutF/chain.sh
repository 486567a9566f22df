set -x
export PYTHONPATH=. OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 WANDB_MODE=offline MOE_LAB_DATA=/work/shared/data
DRIVE_KEYS=base_surv_b.txt nice -n 10 python drive_f.py run_base_c.json tests/hf/test_families_mut.py moe.hf.families.base. 2> drive_base_c.log
DRIVE_KEYS=go_ds_surv_b.txt nice -n 10 python drive_f.py run_go_ds_mx.json tests/hf/test_hf_mxfp4_mut.py moe.hf.families.gpt_oss. moe.hf.families.deepseek_v2. 2> drive_go_ds_mx.log
python -c "
import json; d=json.load(open('run_go_ds_mx.json'))
open('go_ds_surv_c.txt','w').write('\n'.join(k for k,v in d['exit_code_by_key'].items() if v==3))"
DRIVE_KEYS=go_ds_surv_c.txt nice -n 10 python drive_f.py run_go_ds_tm.json tests/hf/test_tensor_map_mut.py moe.hf.families.gpt_oss. moe.hf.families.deepseek_v2. 2> drive_go_ds_tm.log

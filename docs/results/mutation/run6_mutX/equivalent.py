"""The survivors of the sixth run argued equivalent, each with its reason (README.md lists them too).

Every reason holds on any device: none depends on the device or on a dtype default.
"""

S = "eval.analysis.stats."
J = "moe.cluster.jobs."
W = "moe.cluster.sweep_state."
B = "moe.engine.runner.block_tables."
K = "moe.engine.runner.kv_fp8."

EQUIVALENT = {
    # float("NAN") is float("nan"): Python parses the word case-insensitively
    S + "x_expert_domain_share__mutmut_13": "float('NAN') == float('nan') (case-insensitive parse)",
    S + "x_specialization__mutmut_24": "float('NAN')",
    S + "x_coactivation__mutmut_15": "float('NAN')",
    S + "x_uniform_lift__mutmut_17": "float('NAN')",
    S + "x_topk_overlap__mutmut_41": "float('NAN')",
    S + "x_topk_overlap__mutmut_49": "float('NAN')",
    # the mean of an empty float64 tensor is 0 / 0 = NaN: `if n` guards nothing the mean does not give already
    S + "x_topk_overlap__mutmut_37": "mean of no tokens is NaN either way",
    S + "x_topk_overlap__mutmut_45": "mean of no tokens is NaN either way",
    # nan_to_num's fill for NaN: a share row is all NaN (an expert no domain uses: 0 / 0 everywhere) or has
    # none (finite fractions over a positive total); an all-NaN row becomes a constant row whatever the fill
    # (-1, -2, +1 or 0), whose max index does not depend on the constant, and its score is then set to NaN
    S + "x_specialization__mutmut_5": "NaN fill None (0.0): rows are all-NaN or NaN-free",
    S + "x_specialization__mutmut_6": "NaN fill +1.0: as #5",
    S + "x_specialization__mutmut_7": "NaN fill -2.0: as #5",
    # torch.unique's inverse indices take every value 0..V-1 (each unique id occurs), so bincount has length V
    S + "x_vocabulary__mutmut_11": "bincount of unique's inverse has length V without minlength",
    # str.split(sep)[0] is the text before the first separator whatever maxsplit is
    J + "x_override_key__mutmut_6": "split('=')[0] == split('=', 1)[0]",
    J + "x_override_key__mutmut_9": "split('=', 2)[0] == split('=', 1)[0]",
    # submitit 1.5.4's TorchDistributedEnvironment.export tests `if set_cuda_visible_devices:`: None is False there
    J + "x_export_torch_distributed_env__mutmut_7": "set_cuda_visible_devices=None is falsy as False",
    # Path.glob of a folder that does not exist (or of a file) yields nothing: the is_dir() guard changes nothing
    W + "x_read_jobs__mutmut_6": "glob of a missing folder is empty",
    # the sort key of a record without "num": -2 for -1; job numbers are >= 0 (array indices), so either sorts first
    W + "x_read_jobs__mutmut_25": "-2 and -1 both sort before every job number (>= 0)",
    # FP8KVCache (as the fourth run argued, docs/results/mutation/run4_engine)
    K + "xǁFP8KVCacheǁwrite__mutmut_10": "always filtering by `keep` selects every row when all slots are valid",
    K + "xǁFP8KVCacheǁwrite__mutmut_24": "|x / (amax / 448)| <= 448 (1 + 2**-22): the E4M3 cast rounds it to 448; the clamp never acts",
    K + "xǁFP8KVCacheǁwrite__mutmut_25": "as write #24",
    K + "xǁFP8KVCacheǁwrite__mutmut_27": "as write #24",
    K + "xǁFP8KVCacheǁcompact__mutmut_11": "no tables: `used` only indexes the cache (a CPU index tensor indexes a tensor on any device) "
                                          "and the remap made beside it is never returned",
    K + "xǁFP8KVCacheǁcompact__mutmut_14": "as compact #11",
    # block_tables.sync (as the fourth run argued, the same mutants of the same code: docs/results/mutation/run4_engine)
    B + "x_sync__mutmut_5": "growth policy only (capacity >= n in every variant): the same entries returned",
    B + "x_sync__mutmut_14": "growth policy only",
    B + "x_sync__mutmut_16": "growth policy only",
    B + "x_sync__mutmut_17": "growth policy only",
    B + "x_sync__mutmut_19": "growth policy only",
    B + "x_sync__mutmut_20": "growth policy only",
    B + "x_sync__mutmut_23": "growth policy only",
    B + "x_sync__mutmut_24": "`or` differs only for a None tensor with num_synced_blocks > 0, which only sync sets, after making it",
    B + "x_sync__mutmut_28": "done == n writes an empty slice",
    B + "x_sync__mutmut_32": "int64 ids written into the int32 buffer are cast on the copy; block ids < 2**31",
    B + "x_sync__mutmut_34": "as #32",
}

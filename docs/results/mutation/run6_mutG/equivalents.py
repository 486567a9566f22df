"""The sixth run's survivors argued equivalent (EQUIVALENT) or decidable only on an accelerator
(UNDECIDED_ON_CPU), each with its reason; README.md here repeats them. Used by summarize.py."""

M = "moe.quant.schemes.mxfp4."
G = "moe.engine.sampling.guided."

EQUIVALENT = {
    # (run4_features' reasons, the same mutants) `a <= 2` for `a < 2`: at a = 2 both branches give 2
    M + "x_round_to_e2m1__mutmut_8",
    M + "x_round_to_e2m1__mutmut_21",  # `a <= 4`: at 4, round(4) = round(4 / 2) * 2
    M + "x_shared_exponents__mutmut_6",  # `exp.to(None)`: frexp's exponent is int32 already, on every device
    # the upper bound of clamp(-127, 127) dropped: fp32 < 2^128, so floor(log2(amax)) - 2 <= 125
    M + "x_shared_exponents__mutmut_9",
    M + "x_shared_exponents__mutmut_11",
    M + "x_shared_exponents__mutmut_24",  # clamp(-127, 128): as #9
    M + "x_shared_exponents__mutmut_21",  # -128 for an all-zero block: the clamp makes it -127
    # codes.flatten(+2) / flatten(-3) for flatten(-2): the pairs (2k, 2k+1) that share a byte never cross a
    # 32-code block (32 is even) and the reshape restores [..., O, G, 16] in the same row-major order
    M + "x_quantize_mxfp4__mutmut_85",
    M + "x_quantize_mxfp4__mutmut_86",
    # tokenizer_info: of xgrammar's from_huggingface only vocab_type and add_prefix_space are used, which it
    # derives from backend_tokenizer.to_str() and the vocabulary, not from vocab_size (#14 None, #17 dropped)
    # nor from stop_token_ids (#15 None, #18 dropped: then it looks for eos itself, or only warns)
    G + "x_tokenizer_info__mutmut_14",
    G + "x_tokenizer_info__mutmut_15",
    G + "x_tokenizer_info__mutmut_17",
    G + "x_tokenizer_info__mutmut_18",
    # TokenizerInfo(vocab_size=None) / dropped: xgrammar then takes len(encoded), which is vocab_size by construction
    G + "x_tokenizer_info__mutmut_53",
    G + "x_tokenizer_info__mutmut_58",
    # pack_bitmask computes on the CPU (its tensors are made without device=), where torch's int64 -> int32
    # cast keeps the low 32 bits (tensor([2**31, 2**31 + 33, 2**32 - 1]).to(int32) = [-2**31, -2**31 + 33, -1]):
    # subtracting 2**32 or not, or a multiple of it, gives the same int32 words
    G + "x_pack_bitmask__mutmut_34",  # packed > 2**31
    G + "x_pack_bitmask__mutmut_35",  # packed >= 2 * 31
    G + "x_pack_bitmask__mutmut_36",  # packed >= 3**31 (never true: no subtraction)
    G + "x_pack_bitmask__mutmut_37",  # packed >= 2**32 (never true)
    G + "x_pack_bitmask__mutmut_38",  # packed + 2**32
    G + "x_pack_bitmask__mutmut_41",  # packed - 2**33
    G + "x_pack_bitmask__mutmut_14",  # allowed.to(None): assigning bools into the int64 tensor converts them
    G + "x_pack_bitmask__mutmut_25",  # .sum(+1) of the 2-D [words, 32] tensor is .sum(-1)
    # GuidedDecoder.__init__: `[False] * max(0, V - len(decoded_vocab))`: tokenizer_info builds exactly V
    # entries, so the padding list is always empty, True or False
    G + "xǁGuidedDecoderǁ__init____mutmut_55",
    # close(): shutdown(wait=None / True) for wait=False only decides whether close blocks until a fill in
    # flight finishes; no result depends on it
    G + "xǁGuidedDecoderǁclose__mutmut_2",
    G + "xǁGuidedDecoderǁclose__mutmut_3",
}

# The device of a tensor: on CPU every tensor is on the CPU, so `.to(None)` / a table made without
# `device=` is the same; on an accelerator the CPU tensor meets a CUDA one (an error, or a copy
# xgrammar may make itself). Not decidable here (no GPU); counted as not killed.
UNDECIDED_ON_CPU = {
    M + "x_quantize_mxfp4__mutmut_69",  # torch.tensor(_MAGNITUDES, device=None): the table on the CPU
    M + "x_quantize_mxfp4__mutmut_71",  # device= dropped: as #69
    G + "xǁGuidedDecoderǁmask_drafts__mutmut_33",  # bitmask.to(None): the bitmask stays on the CPU
}

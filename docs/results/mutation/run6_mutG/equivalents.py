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
}

UNDECIDED_ON_CPU: set[str] = set()

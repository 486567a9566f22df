"""`python -m benchmarks.generate` with the torch backend's prefill rule as before this change: the padded
reference for every prefill under `max_padded_scores`, one sequence at a time only above it (the A/B's other
arm). Same arguments."""
import sys

from benchmarks import generate
from moe.attention.paged_torch import TorchPagedAttention


def per_sequence(self, q, block_tables, max_seqlen_q, block_size):
    S = block_tables.shape[0]
    return S * q.shape[1] * max_seqlen_q * block_tables.shape[1] * block_size > self.max_padded_scores


TorchPagedAttention.per_sequence = per_sequence
sys.exit(generate.main(sys.argv[1:]))

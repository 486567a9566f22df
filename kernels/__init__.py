"""Custom kernels (Triton), each with a plain PyTorch reference beside it."""

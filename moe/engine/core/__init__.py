"""The engine core: `LLMEngine` (engine: the request table, `validate_request`, `step`, stats),
`LLM` (llm: `LLMEngine` plus generate / chat / stream), the scheduler (continuous batching,
chunked prefill, preemption), output (the one append-and-stop-check path every new token takes,
plain or speculative, and the stream events) and invariants (the debug checks after every step).
"""

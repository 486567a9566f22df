"""Chat data (`data=chat`): conversations -> chat-template tokens with assistant-only labels ->
packed (document-masked) or padded training rows.

    rows.py      JSONL / parquet / hub rows of `messages` (OpenAI) or `conversations` (ShareGPT)
    render.py    one conversation -> token ids + which of them the loss is on (assistant turns)
    packing.py   conversations -> fixed-length rows: packed with segment ids, or padded
    batcher.py   deterministic, resumable batches of those rows (the TokenBatcher interface)
    prepare.py   `prepare_chat`: the whole step, what `prepare_data` returns for data=chat
"""

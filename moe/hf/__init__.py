"""Hugging Face interop for the pretrained MoE families (mixtral, olmoe, qwen2_moe, qwen3_moe).

    layout.py      what an HF directory is (`is_hf_dir`), without importing transformers
    families/      one module per family (`FAMILIES`, keyed by model_type): its config both ways,
                   the fields it maps, ignores (with why) or refuses, its on-disk expert names
    tensor_map.py  the one table of HF tensor names <-> ours, for both HF layouts
    convert.py     our `Transformer` <-> the families' HF models: configs, state dicts, models
    io.py          HF directories in: tokenizers (`HFTokenizer`) and models (`load_hf_dir`, shard by
                   shard onto a meta-device model through `moe.weights`)
    commands.py    `python -m moe.hf export|import` (`export_hf`, `import_hf`)

Every module but `layout` imports transformers (the `hf` extra), so nothing is imported here:
`from moe.hf.convert import to_hf_model`.
"""

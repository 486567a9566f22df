"""Expert-specialisation analysis (the `expert_analysis` eval task, eval/tasks/expert_analysis.py).

Modules: stats (the statistics, plain functions of routing tensors: domain and vocabulary
specialisation, co-activation, top-k overlap), collect (the text of each domain and the one pass
that records every MoE layer's router choices), plots (the figures), report (the Markdown report).
"""

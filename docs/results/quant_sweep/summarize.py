"""Summary of the quant_sweep runs of this folder (summary.json): per group size, each scheme's
perplexity (checked equal across repeats), weight bytes, and the median (min-max) over repeats of
quantizing time, engine tokens/s (wall, CPU) and their ratio to `none` within the same run.

    python docs/results/quant_sweep/summarize.py docs/results/quant_sweep
"""
import json
import statistics
import sys
from pathlib import Path


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarize(folder: Path) -> dict:
    out = {}
    for group in (128, 32):
        runs = [json.loads(p.read_text()) for p in sorted(folder.glob(f"g{group}_r*.json"))]
        if not runs:
            continue
        schemes = [r["scheme"] for r in runs[0]["rows"]]
        rows = {}
        for i, scheme in enumerate(schemes):
            per_run = [r["rows"][i] for r in runs]
            none = [r["rows"][0] for r in runs]
            ppl = {round(row["token_perplexity"], 6) for row in per_run}
            assert len(ppl) == 1, (group, scheme, ppl)  # deterministic: every repeat the same
            rows[scheme] = {
                "token_perplexity": per_run[0]["token_perplexity"],
                "d_token_perplexity": per_run[0]["d_token_perplexity"],
                "weight_bytes": per_run[0]["weight_bytes"], "weight_bytes_ratio": per_run[0]["weight_bytes_ratio"],
                "quantize_s": spread([row["quantize_s"] for row in per_run]),
                "tokens_per_s": spread([row["engine_tokens_per_s"] for row in per_run]),
                "tokens_per_cpu_s": spread([row["engine_tokens_per_cpu_s"] for row in per_run]),
                "cpu_ratio_to_none": spread([row["engine_tokens_per_cpu_s"] / n["engine_tokens_per_cpu_s"]
                                             for row, n in zip(per_run, none)]),
                "wall_ratio_to_none": spread([row["engine_tokens_per_s"] / n["engine_tokens_per_s"]
                                              for row, n in zip(per_run, none)]),
            }
        out[f"group_size_{group}"] = {"repeats": len(runs), "rows": rows}
    return out


if __name__ == "__main__":
    folder = Path(sys.argv[1])
    (folder / "summary.json").write_text(json.dumps(summarize(folder), indent=1) + "\n")

"""The Markdown report of the expert analysis (`<run dir>/report.md`), from results.json's sections."""

from __future__ import annotations

from pathlib import Path

from moe.report import markdown_table


def token_text(text: str) -> str:
    """A decoded token for a Markdown table cell: escapes visible, pipes and angle brackets escaped."""
    return repr(text)[1:-1].replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _image(plots: dict, name: str) -> list[str]:
    return [f"![{name}]({Path(plots[name]).name})", ""] if name in plots else []


def _domains(results: dict) -> list[str]:
    d = results["domain_specialization"]
    rows = [[name, results["domain_sources"][name], d["tokens"][name]] for name in d["domains"]]
    return ["## Domains", "", markdown_table(["domain", "source", "tokens analysed"], rows, align="llr"), ""]


def _specialisation(results: dict, plots: dict) -> list[str]:
    d = results["domain_specialization"]
    rows = []
    for L in d["layers"]:
        scored = [(s, e) for e, s in enumerate(L["specialization"]) if s is not None]
        s, e = max(scored) if scored else (None, None)
        rows.append([L["layer"], L["mean_specialization"], e, L["top_domain"][e] if e is not None else None, s])
    return ["## 1. Domain specialisation", "",
            f"Fraction of each domain's tokens routed to each expert (uniform k/E = {d['uniform']:.3g}); an expert's "
            f"score is its largest domain share, every domain weighted equally "
            f"(1/D = {d['chance_specialization']:.2f}: no preference; 1: it sees one domain only).", "",
            *_image(plots, "domain_specialization"), *_image(plots, "specialization_scores"),
            markdown_table(["MoE layer", "mean score", "most specialised expert", "its domain", "its score"], rows,
                           align="rrrlr", float_fmt="{:.3f}"), ""]


def _vocabulary(results: dict, plots: dict, max_rows: int = 64) -> list[str]:
    v = results["vocabulary"]
    layers = v["layers"]
    n_experts = len(layers[0]["experts"])
    shown = layers if len(layers) * n_experts <= max_rows else [layers[0], layers[-1]]
    out = ["## 2. Vocabulary specialisation", "",
           f"Per expert: the fraction of its inputs whose token id is one of its {v['top_n']} most frequent ids, and "
           "the tokens it receives most often relative to their frequency (share of the token's occurrences routed to "
           f"it; uniform k/E = {v['uniform_share']:.3g}; tokens seen at least {v['min_count']} times).", "",
           *_image(plots, "vocabulary")]
    if len(shown) < len(layers):
        out += [f"Tables for the first and last MoE layers (results.json has all {len(layers)}).", ""]
    for L in shown:
        rows = [[ex["expert"], ex["tokens"], ex["top_n_fraction"],
                 ", ".join(f"{token_text(t['text'])} ({t['share']:.2f})" for t in ex["top_tokens"])]
                for ex in L["experts"]]
        out += [f"MoE layer {L['layer']}:", "",
                markdown_table(["expert", "tokens", f"top-{v['top_n']} fraction", "top tokens (share)"], rows,
                               align="rrrl", float_fmt="{:.3f}"), ""]
    return out


def _coactivation(results: dict, plots: dict) -> list[str]:
    c = results["coactivation"]
    out = ["## 3. Co-activation", ""]
    if "skipped" in c:
        return out + [f"Skipped: {c['skipped']}.", ""]
    rows = [[L["layer"], "; ".join(f"{p['experts'][0]}+{p['experts'][1]}: lift {p['lift']:.2f}, "
                                   f"P(j\\|i) {p['conditional'][0]:.2f}" for p in L["top_pairs"][:3])]
            for L in c["layers"]]
    return out + ["Lift P(i,j) / (P(i) P(j)) of each pair of experts chosen for the same token (1: independent; "
                  f"a uniformly random top-k router gives {c['uniform_lift']:.2f}, since an expert cannot be "
                  "chosen twice).", "", *_image(plots, "coactivation"),
                  markdown_table(["MoE layer", "pairs with the highest lift"], rows, align="rl"), ""]


def _saturation(results: dict, plots: dict) -> list[str]:
    s = results["saturation"]
    out = ["## 4. Router saturation over training", ""]
    if "skipped" in s:
        return out + [f"Skipped: {s['skipped']}.", ""]
    layers = s["layers"]
    rows = [[p["step"], *p["overlap"], p["mean_overlap"]] for p in s["checkpoints"]]
    return out + [f"Top-k overlap of each checkpoint's routing with step {s['reference_step']}'s on a fixed probe "
                  f"set of {s['probe_tokens']} tokens (the checkpoints the run directory keeps: the last "
                  "`train.keep_last`).", "", *_image(plots, "router_saturation"),
                  markdown_table(["step", *[f"layer {li}" for li in layers], "mean"], rows,
                                 align="r" * (len(layers) + 2), float_fmt="{:.3f}"), ""]


def _agreement(results: dict, plots: dict) -> list[str]:
    a = results.get("agreement")
    if not a:
        return []
    o = a["other"]
    rows = [[L["layer"], L["overlap"], L["exact"]] for L in a["layers"]]
    return ["## 5. Routing agreement between two models", "",
            f"This checkpoint vs `{o['path']}` (top-k {o['top_k']}, {o['dtype']}) on {a['probe_tokens']} probe tokens: "
            f"mean top-k overlap {a['mean_overlap']:.3f}.", "", *_image(plots, "routing_agreement"),
            markdown_table(["MoE layer", "top-k overlap", "same expert set"], rows, align="rrr", float_fmt="{:.3f}"),
            ""]


def _generation(results: dict, plots: dict) -> list[str]:
    g = results.get("generation")
    out = ["## 6. Expert usage under generation", ""]
    if not g:
        return []
    if "skipped" in g:
        return out + [f"Skipped: {g['skipped']}.", ""]
    domains = g["domains"]
    rows = [[L["layer"], *[L["tv_engine_vs_teacher_forced"][d] for d in domains],
             *[L["tv_generated_vs_real"][d] for d in domains]] for L in g["layers"]]
    cols = ["MoE layer", *[f"engine vs forward: {d}" for d in domains], *[f"generated vs real: {d}" for d in domains]]
    e = g["engine"]
    return out + [f"{g['prompts_per_domain']} prompts of {g['prompt_tokens']} tokens per domain, {g['new_tokens']} new "
                  f"tokens each (temperature {g['temperature']}), through the engine (`LLM.stats()['moe/expert_load']`,"
                  f" {e['tokens_routed']} tokens routed) and through one teacher-forced forward over the same tokens "
                  "(training-time routing). Total variation distance between the expert loads (0: identical).", "",
                  *_image(plots, "generation"), markdown_table(cols, rows, align="r" * len(cols), float_fmt="{:.4f}"),
                  ""]


def write_report(results: dict, path: Path) -> Path:
    m, ck = results["model"], results["checkpoint"]
    plots = results["plots"]
    lines = [f"# Expert analysis: `{ck.get('path')}`", "",
             f"Step {ck.get('step')}; {m['n_layers']} layers ({len(m['moe_layers'])} MoE), {m['n_experts']} experts, "
             f"top-{m['top_k']} `{m['router']}` router; {results['tokens_analysed']} tokens analysed in one pass "
             f"({results['timing']['collect_seconds']:.1f} s).", "",
             *_domains(results), *_specialisation(results, plots), *_vocabulary(results, plots),
             *_coactivation(results, plots), *_saturation(results, plots), *_agreement(results, plots),
             *_generation(results, plots)]
    path.write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    return path

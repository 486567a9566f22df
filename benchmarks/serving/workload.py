"""The prompts: MT-Bench first turns (chat) or chunks of a text file (completions), and which of
them fit the server's context with `--max-tokens` (asked of its `/tokenize`)."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MT_BENCH = REPO.parent / "shared" / "data" / "mt_bench" / "question.jsonl"
MAX_CHUNKS = 10_000


def load_prompts(args) -> list[str]:
    """`args.corpus` cut into chunks of about `args.corpus_chars` characters (whole paragraphs
    packed together), else the first turns of the MT-Bench questions in `args.dataset`."""
    if args.corpus:
        text = Path(args.corpus).read_text(encoding="utf-8", errors="replace")
        paras = [p.strip() for p in text.split("\n\n") if p.strip()]
        chunks, buf = [], ""
        for p in paras:
            buf = f"{buf}\n\n{p}" if buf else p
            if len(buf) >= args.corpus_chars:
                chunks.append(buf[: args.corpus_chars])
                buf = ""
            if len(chunks) >= MAX_CHUNKS:
                break
        return chunks or [text[: args.corpus_chars]]
    path = Path(args.dataset)
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["turns"][0] for r in rows if r.get("turns")]


def api_root(base_url: str) -> str:
    """The server root of an OpenAI base URL (`http://host:port/v1` -> `http://host:port`)."""
    return base_url[: -len("/v1")] if base_url.endswith("/v1") else base_url


async def filter_prompts(base_url: str, api_key: str, model: str, prompts: list[str], args) -> tuple[list[str], dict]:
    """Keep prompts whose tokens + max_tokens fit the server's context (via its /tokenize)."""
    import httpx  # lazy: a dev extra, needed only when a benchmark runs

    kept, lens, info = [], [], {}
    async with httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {api_key}"}) as c:
        for p in prompts:
            body = {"model": model, "messages": [{"role": "user", "content": p}]} if args.endpoint == "chat" \
                else {"model": model, "prompt": p}
            r = await c.post(api_root(base_url) + "/tokenize", json=body)
            if r.status_code != 200:
                return prompts, {"note": f"no /tokenize ({r.status_code}): prompts not filtered"}
            d = r.json()
            if d["count"] + args.max_tokens <= d["max_model_len"]:
                kept.append(p)
                lens.append(d["count"])
            info["max_model_len"] = d["max_model_len"]
    info.update(prompts_available=len(prompts), prompts_fitting=len(kept),
                prompt_tokens_mean=sum(lens) / len(lens) if lens else None,
                prompt_tokens_max=max(lens) if lens else None)
    return kept, info

"""`EngineDriver` without HTTP: requests added from the event loop come back as events on their
queues, in the same tokens as `LLM.generate`; aborts free the blocks; calls run between steps."""

from __future__ import annotations

import asyncio
import copy

import pytest

from moe.engine import LLM, SamplingParams
from moe.serve.driver import EngineDead, EngineDriver

pytestmark = pytest.mark.timeout(60)


def test_driver_round_trip(tiny_model, tok):
    llm = LLM.from_model(copy.deepcopy(tiny_model), tok, collect_routing_stats=False)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    ids = tok.encode("the lazy dog")
    expected = llm.generate(ids, params)[0].token_ids
    seen_by_hook = []

    async def main():
        driver = EngineDriver(llm, on_events=seen_by_hook.extend)
        with pytest.raises(EngineDead):
            driver.add("early", ids, params, asyncio.Queue())
        driver.start()
        try:
            done, long_q = asyncio.Queue(), asyncio.Queue()
            driver.add("a", ids, params, done)
            driver.add("b", ids, SamplingParams(temperature=0, max_tokens=400, ignore_eos=True), long_q)
            tokens = []
            while True:
                ev = await asyncio.wait_for(done.get(), 30)
                tokens += ev.token_ids
                if ev.finished:
                    break
            await asyncio.wait_for(long_q.get(), 30)  # b is running
            assert driver.num_pending == 1
            driver.abort("b")  # its queue is dropped at once; the engine frees it before its next step
            assert driver.num_pending == 0
            stats = await driver.call(lambda llm: llm.stats())  # applied after the abort: blocks already free
            for _ in range(500):  # the abort itself is reported by the engine's next step (to the hook)
                if any(e.request_id == "b" and e.finish_reason == "abort" for e in seen_by_hook):
                    break
                await asyncio.sleep(0.01)
            return tokens, ev, stats
        finally:
            await driver.stop()
            assert not driver.alive

    tokens, last, stats = asyncio.run(main())
    assert tokens == expected and last.finish_reason == "length" and last.output.token_ids == expected
    assert stats["kv_blocks_used"] == 0 and stats["num_running"] == 0
    assert any(e.request_id == "b" and e.finish_reason == "abort" for e in seen_by_hook)

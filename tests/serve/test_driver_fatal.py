"""`EngineDriver` with an engine that fails for good (a tensor-parallel rank died; here its runner's
`check_ranks` says so): live requests get the rank's error, `on_fatal` is called once, also when
the failure comes while the driver is idle, and the driver refuses work afterwards. The real
processes are tests/serve/test_serve_parallel.py."""

from __future__ import annotations

import asyncio
import copy

import pytest

from moe.engine import LLM, SamplingParams
from moe.serve.driver import HEALTH_POLL_S, EngineDead, EngineDriver

pytestmark = pytest.mark.timeout(60)
WHY = "tensor-parallel rank 1 (pid 4242) exited with code -9"


class DyingRunner:
    """The engine's runner, plus the `check_ranks` of a parallel runner: None until `failure` is set."""

    def __init__(self, runner):
        self.runner, self.failure = runner, None

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def check_ranks(self):
        return self.failure


@pytest.fixture
def llm(tiny_model, tok):
    llm = LLM.from_model(copy.deepcopy(tiny_model), tok, collect_routing_stats=False)
    llm.runner = DyingRunner(llm.runner)
    return llm


def run_until_fatal(llm, tok, with_request: bool):
    async def main():
        fatal = asyncio.get_running_loop().create_future()
        driver = EngineDriver(llm, on_fatal=fatal.set_result)
        driver.start()
        q = asyncio.Queue()
        events = []
        try:
            if with_request:
                driver.add("a", tok.encode("the lazy dog"), SamplingParams(max_tokens=400, ignore_eos=True), q)
                events.append(await asyncio.wait_for(q.get(), 30))  # it runs
            else:
                await asyncio.sleep(2 * HEALTH_POLL_S)  # idle: the driver sleeps on its wake event
            llm.runner.failure = WHY
            message = await asyncio.wait_for(fatal, 10 * HEALTH_POLL_S)
            while with_request and not events[-1].finished:
                events.append(await asyncio.wait_for(q.get(), 10))
            await asyncio.to_thread(driver._thread.join, 10)
            assert not driver.alive and driver.fatal == WHY
            with pytest.raises(EngineDead):
                driver.add("b", [1, 2], SamplingParams(max_tokens=2), asyncio.Queue())
            with pytest.raises(EngineDead):
                await driver.call(lambda llm: llm.stats())
            return message, events
        finally:
            await driver.stop()

    return asyncio.run(main())


def test_a_failure_mid_request_fails_it_with_the_ranks_error(llm, tok):
    message, events = run_until_fatal(llm, tok, with_request=True)
    assert message == WHY
    last = events[-1]
    assert last.finish_reason == "error" and last.output.error == WHY
    assert sum(len(e.token_ids) for e in events) < 400
    assert llm.stats()["kv_blocks_used"] == 0  # the failed request's blocks were freed


def test_a_failure_while_idle_is_noticed_by_the_health_poll(llm, tok):
    message, events = run_until_fatal(llm, tok, with_request=False)
    assert message == WHY and events == []

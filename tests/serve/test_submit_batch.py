"""Pool entries ready in the same event-loop turn go to the scheduler in one call
(``submit_many``), each caller gets its own status or error, without Ray."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from br_serve.engine.base import SamplingParams
from br_serve.serve.frontend.events import GenerateError
from br_serve.serve.frontend.submits import SubmitBatcher
from br_serve.serve.wire.messages import Admission
from br_serve.transport.base import KVHandle


def _entry(rid: str) -> Admission:
    return Admission(rid, "ingress-x", 5, -1, SamplingParams(max_tokens=4),
                     KVHandle("remote", rid, 0, freed_by_consumer=True))


class _Scheduler:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, list[str]]] = []
        self.fail = fail

    async def call(self, method: str, arg: Any) -> Any:
        await asyncio.sleep(0)
        if self.fail:
            raise GenerateError(503, "scheduler unavailable: gone", "service_unavailable")
        if method == "submit":
            self.calls.append((method, [arg.request_id]))
            return "queued"
        ids = [e.request_id for e in arg]
        self.calls.append((method, ids))
        return ["full" if rid == "b" else "queued" for rid in ids]


def test_a_burst_is_one_call_and_each_gets_its_status() -> None:
    sched = _Scheduler()
    batcher = SubmitBatcher(sched.call)

    async def scenario() -> list[Any]:
        burst = await asyncio.gather(*(batcher.submit(_entry(r)) for r in "abc"))
        alone = await batcher.submit(_entry("d"))
        return [*burst, alone]

    assert asyncio.run(scenario()) == ["queued", "full", "queued", "queued"]
    assert sched.calls == [("submit_many", ["a", "b", "c"]), ("submit", ["d"])]
    assert batcher.batches == [3, 1]


def test_a_failed_call_fails_every_entry_of_its_batch() -> None:
    batcher = SubmitBatcher(_Scheduler(fail=True).call)

    async def scenario() -> list[Any]:
        return list(await asyncio.gather(*(batcher.submit(_entry(r)) for r in "ab"),
                                         return_exceptions=True))

    errors = asyncio.run(scenario())
    assert all(isinstance(e, GenerateError) and e.status == 503 for e in errors)


def test_a_cancelled_caller_does_not_stop_the_others() -> None:
    sched = _Scheduler()
    batcher = SubmitBatcher(sched.call)

    async def scenario() -> Any:
        gone = asyncio.ensure_future(batcher.submit(_entry("a")))
        stays = asyncio.ensure_future(batcher.submit(_entry("c")))
        await asyncio.sleep(0)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        return await stays

    assert asyncio.run(scenario()) == "queued"
    assert sched.calls == [("submit_many", ["a", "c"])]

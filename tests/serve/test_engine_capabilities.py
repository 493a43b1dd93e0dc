"""Engine capabilities are declared on the engine class and drive the decode replica
(no Ray): an engine that declares ``wakes_on_admit`` is nudged on each admission, one
that declares ``fails_streams`` has its failures turned into the owner's
``StreamError``; an engine that declares neither is never asked.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

import br_serve.engine.factory as factory
from br_serve.engine.base import DecodeEngine, EngineCapabilities, SamplingParams
from br_serve.engine.emulated import EmulatedEngine
from br_serve.engine.remote import RemoteDecodeEngine
from br_serve.engine.torch_engine import TorchEngine
from br_serve.serve.config import parse_graph_config
from br_serve.serve.replica.decode import DecodeReplica
from br_serve.serve.wire.messages import Admission, StreamError
from br_serve.transport.base import KVHandle
from tests.serve.helpers import RecordingTransport, fake_lease
from tests.serve.test_decode_step import FakeBarrier

KV_BYTES_PER_TOKEN = 4


class _Both(EmulatedEngine):
    """Declares both capabilities; records the calls; fails ``"broken"`` on its own."""

    capabilities: ClassVar[EngineCapabilities] = EngineCapabilities(wakes_on_admit=True,
                                                                    fails_streams=True)

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.nudges = 0
        self.asked = 0

    def nudge(self) -> None:
        self.nudges += 1

    def take_failures(self) -> list[tuple[str, str, bool]]:
        self.asked += 1
        if "broken" in self._running:
            self.abort("broken")
            return [("broken", "remote stream broke", True)]
        return []


class _Neither(_Both):
    capabilities: ClassVar[EngineCapabilities] = EngineCapabilities()


def test_each_engine_states_its_own_capabilities() -> None:
    assert DecodeEngine.capabilities == EngineCapabilities()
    assert EmulatedEngine.capabilities == EngineCapabilities()
    assert TorchEngine.capabilities == EngineCapabilities()
    assert RemoteDecodeEngine.capabilities == EngineCapabilities(wakes_on_admit=True,
                                                                 fails_streams=True)


@pytest.fixture(params=[_Both, _Neither], ids=["both", "neither"])
def replica(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
            ) -> Iterator[tuple[DecodeReplica, _Both]]:
    engine = request.param(kv_bytes_per_token=KV_BYTES_PER_TOKEN)
    monkeypatch.setattr(factory, "make_engine", lambda *a, **kw: engine)
    rep = DecodeReplica(0, parse_graph_config(slots=4, step_b_s=0.002,
                                              engine_kv_bytes_per_token=KV_BYTES_PER_TOKEN),
                        "no-scheduler")
    fatal: list[str] = []
    rep.on_fatal = lambda: fatal.append("step thread failed")
    rep.lease, _ = fake_lease(RecordingTransport())
    rep._tell_scheduler = lambda method, *args: True  # type: ignore[method-assign]
    yield rep, engine
    asyncio.run(rep.shutdown())
    rep._thread.join(5)
    assert not fatal


def _admission(rid: str, max_tokens: int) -> Admission:
    kv = KVHandle("fake", rid, 5 * KV_BYTES_PER_TOKEN)
    return Admission(rid, "ingress-x", 5, 7, SamplingParams(max_tokens=max_tokens), kv)


def test_the_replica_uses_what_the_engine_declares(
        replica: tuple[DecodeReplica, _Both]) -> None:
    rep, engine = replica

    async def admit() -> None:
        for rid in ("ok", "broken"):
            assert await rep.admit(_admission(rid, 50))

    asyncio.run(admit())
    rep._loop = None  # that loop is closed: no wake-ups to deliver
    with rep._lock:
        rep._barrier = FakeBarrier()  # type: ignore[assignment]
        rep._wake_step.notify_all()
    declared = engine.capabilities
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and rep.core.step < 5:
        time.sleep(0.01)
    with rep._lock:
        outbox = list(rep._outbox["ingress-x"])
    errors = [e for e in outbox if isinstance(e, StreamError)]
    assert engine.nudges == (2 if declared.wakes_on_admit else 0)
    if declared.fails_streams:
        assert engine.asked >= 5
        assert [(e.request_id, e.retryable) for e in errors] == [("broken", True)]
    else:
        assert engine.asked == 0 and errors == []
    assert isinstance(rep._thread, threading.Thread)

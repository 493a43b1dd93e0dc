"""KV lifetime without Ray: DecodeReplica.admit releases every handle it takes exactly
once (through the lease), its book ends every taken request finished or dropped, and
the keeper frees the source copy through its transport on release and on expiry.

Why it matters: Mooncake keeps a key until it is removed, so a handle admit forgets
stays in the prefill worker's segment until every put fails (-200); and a taken request
the replica never reports again would hold a slot in the scheduler's mirror for ever.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterator

import pytest

from br_serve.engine.base import SamplingParams
from br_serve.serve.config import parse_graph_config
from br_serve.serve.replica.decode import DecodeReplica
from br_serve.serve.wire.messages import Admission, Admitted, StreamError
from br_serve.transport.base import KVHandle, TransportError
from br_serve.transport.keeper import KVKeeper
from tests.serve.helpers import FakeKeeper, RecordingTransport, fake_lease

KV_BYTES_PER_TOKEN = 4
FATAL: list[str] = []


def _fail() -> None:
    FATAL.append("step thread failed")  # (checked after the test; never exit pytest)


@pytest.fixture()
def replica() -> Iterator[tuple[DecodeReplica, RecordingTransport, FakeKeeper]]:
    # slots=3 so a fourth admission is refused; the step thread idles (no barrier)
    rep = DecodeReplica(0, parse_graph_config(slots=3,
                                              engine_kv_bytes_per_token=KV_BYTES_PER_TOKEN),
                        "no-scheduler")
    rep.on_fatal = _fail
    transport = RecordingTransport(bad=frozenset({"lost"}))
    rep.lease, keeper = fake_lease(transport)
    yield rep, transport, keeper
    asyncio.run(rep.shutdown())
    rep._thread.join(5)


def _admission(rid: str, prompt_tokens: int = 5) -> Admission:
    kv = KVHandle("fake", rid, prompt_tokens * KV_BYTES_PER_TOKEN)
    return Admission(rid, "ingress-x", prompt_tokens, 7, SamplingParams(max_tokens=4), kv)


def test_admit_releases_each_handle_exactly_once(
        replica: tuple[DecodeReplica, RecordingTransport, FakeKeeper]) -> None:
    rep, transport, keeper = replica

    async def scenario() -> list[str]:
        replies = list(await asyncio.gather(*(rep.admit(_admission(r)) for r in ("a", "b"))))
        replies.append(await rep.admit(_admission("a")))  # resubmission: no-op
        replies.append(await rep.admit(_admission("lost")))  # pull fails
        replies.append(await rep.admit(_admission("c")))
        replies.append(await rep.admit(_admission("d")))  # full: refused
        await asyncio.sleep(0)  # let the fire-and-forget releases run
        return [r.status for r in replies]

    assert asyncio.run(scenario()) == ["queued", "queued", "duplicate", "failed", "queued",
                                       "full"]
    assert sorted(transport.gets) == ["a", "b", "c", "lost"]
    # pulled or failed: released once each; the refused one keeps its KV (the scheduler
    # retries it elsewhere)
    assert collections.Counter(keeper.released) == {"a": 1, "b": 1, "c": 1, "lost": 1}
    events = rep._outbox["ingress-x"]
    assert [e.request_id for e in events if isinstance(e, Admitted)] == ["a", "b", "c"]
    errors = [e for e in events if isinstance(e, StreamError)]
    assert [(e.request_id, e.retryable) for e in errors] == [("lost", True)]
    assert rep.core.book.taken() == 3  # a failed pull frees its slot at once


def test_abort_before_install_is_reported_as_dropped(
        replica: tuple[DecodeReplica, RecordingTransport, FakeKeeper]) -> None:
    """Before: an abort of a queued request was lost (installed later anyway), and a
    taken request that never ran stayed in the scheduler's in-flight set."""
    rep, _, _ = replica

    async def scenario() -> None:
        assert (await rep.admit(_admission("a"))).status == "queued"
        await rep.abort("a")

    asyncio.run(scenario())
    installs, aborts = rep.core.book.take_work()
    assert installs == [] and aborts == []
    assert rep.core.book.take_report() == ([], ["a"], [])
    assert rep.core.book.taken() == 0


def test_failed_install_is_reported_as_dropped(
        replica: tuple[DecodeReplica, RecordingTransport, FakeKeeper]) -> None:
    rep, _, _ = replica
    bad = Admission("bad", "ingress-x", 5, 7, SamplingParams(max_tokens=4),
                    KVHandle("fake", "bad", 3))  # 3 bytes for 5 tokens: engine refuses
    asyncio.run(rep.admit(bad))
    rep._loop = None  # that loop is closed: no poll wake-ups to deliver
    rep._install()
    assert rep.core.book.take_report() == ([], ["bad"], [])
    errors = [e for e in rep._outbox["ingress-x"] if isinstance(e, StreamError)]
    assert [e.request_id for e in errors] == ["bad"] and "admit failed" in errors[0].message


class _FreeingTransport(RecordingTransport):
    def release(self, handle: KVHandle) -> None:
        super().release(handle)
        if handle.key == "broken":
            raise TransportError("fake: remove failed: code -900")


def test_keeper_frees_through_its_transport_on_release_and_expiry() -> None:
    now = [0.0]
    keeper = KVKeeper(ttl_s=10.0, clock=lambda: now[0])
    transport = _FreeingTransport()
    keeper._transport = transport

    async def scenario() -> int:
        await keeper.hold(KVHandle("fake", "a", 4))
        await keeper.hold(KVHandle("fake", "old", 4))
        await keeper.release(KVHandle("fake", "a", 4))
        await keeper.release(KVHandle("fake", "broken", 4))  # logged, not raised
        now[0] = 11.0
        await keeper.hold(KVHandle("fake", "new", 4))  # sweeps "old"
        return await keeper.size()

    assert asyncio.run(scenario()) == 1
    assert transport.releases == ["a", "broken", "old"]

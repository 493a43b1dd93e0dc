"""DecodeReplica.admit frees every KV handle it takes exactly once (no Ray, no Mooncake).

Why it matters: Mooncake keeps a key until it is removed, so a handle admit forgets
stays in the prefill worker's segment until every put fails (-200).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterator

import pytest

from br_serve.engine.base import SamplingParams
from br_serve.serve.decode import DecodeReplica
from br_serve.serve.messages import Admission, Admitted, StreamError
from br_serve.transport.base import KVHandle, TransportError
from tests.serve.helpers import FakeKeeper, RecordingTransport

KV_BYTES_PER_TOKEN = 4


@pytest.fixture()
def replica() -> Iterator[DecodeReplica]:
    # slots=3 so a fourth admission is refused; the step thread idles (no barrier)
    rep = DecodeReplica(0, {"slots": 3, "kv_bytes_per_token": KV_BYTES_PER_TOKEN},
                        "no-scheduler")
    rep.transport = RecordingTransport(bad=frozenset({"lost"}))
    rep._keeper = FakeKeeper()
    yield rep
    asyncio.run(rep.shutdown())
    rep._thread.join(5)


def _admission(rid: str, prompt_tokens: int = 5) -> Admission:
    kv = KVHandle("fake", rid, prompt_tokens * KV_BYTES_PER_TOKEN)
    return Admission(rid, "ingress-x", prompt_tokens, 7, SamplingParams(max_tokens=4), kv)


def test_admit_releases_each_handle_exactly_once(replica: DecodeReplica) -> None:
    transport: RecordingTransport = replica.transport  # type: ignore[assignment]
    keeper: FakeKeeper = replica._keeper

    async def scenario() -> list[bool]:
        results = list(await asyncio.gather(*(replica.admit(_admission(r))
                                              for r in ("a", "b"))))
        results.append(await replica.admit(_admission("a")))  # resubmission: no-op
        results.append(await replica.admit(_admission("lost")))  # pull fails
        results.append(await replica.admit(_admission("c")))
        results.append(await replica.admit(_admission("d")))  # full: refused
        return results

    assert asyncio.run(scenario()) == [True, True, True, True, True, False]
    assert sorted(transport.gets) == ["a", "b", "c", "lost"]
    # pulled or failed: released once each, through the transport and the keeper;
    # the refused one keeps its KV (the scheduler retries it elsewhere)
    assert collections.Counter(transport.releases) == {"a": 1, "b": 1, "c": 1, "lost": 1}
    assert collections.Counter(keeper.released) == {"a": 1, "b": 1, "c": 1, "lost": 1}
    events = replica._outbox["ingress-x"]
    assert [e.request_id for e in events if isinstance(e, Admitted)] == ["a", "b", "c"]
    errors = [e for e in events if isinstance(e, StreamError)]
    assert [(e.request_id, e.retryable) for e in errors] == [("lost", True)]


def test_release_failure_does_not_fail_the_admission(replica: DecodeReplica) -> None:
    transport: RecordingTransport = replica.transport  # type: ignore[assignment]

    def failing_release(handle: KVHandle) -> None:
        transport.releases.append(handle.key)
        raise TransportError("fake: remove failed: code -900")

    transport.release = failing_release  # type: ignore[method-assign]
    assert asyncio.run(replica.admit(_admission("a"))) is True
    assert transport.releases == ["a"]
    assert len(replica._admit_q) == 1  # still queued for the step thread


def test_release_kv_rpc_frees_an_unpulled_handle(replica: DecodeReplica) -> None:
    """What the ingress asks of a live replica for a request no replica took."""
    transport: RecordingTransport = replica.transport  # type: ignore[assignment]
    asyncio.run(replica.release_kv(KVHandle("fake", "orphan", 20)))
    assert transport.releases == ["orphan"] and transport.gets == []

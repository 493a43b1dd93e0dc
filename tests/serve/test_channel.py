"""The event channel (``br_serve.serve.wire.channel``): a real DecodeReplica (fake barrier,
no Ray) writing to a real Streamer's channel over 127.0.0.1, on one event loop.

Why it matters: tokens leave the Ray RPC path for a TCP stream, so everything the poll
used to guarantee must hold on the new path too: every event of a stream arrives once
and in order (``Admitted`` first, including across the poll-to-channel hand-over), a
connection without the owner's token is refused, a channel that cannot connect falls
back to polling, and a channel that breaks makes its replica lost (its streams
re-prefill) instead of silently dropping tokens.
"""

from __future__ import annotations

import asyncio
import struct
import time
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from br_serve.engine.base import SamplingParams
from br_serve.serve.config import parse_graph_config
from br_serve.serve.frontend.events import Inbox, _Lost
from br_serve.serve.frontend.streams import Streamer
from br_serve.serve.replica.decode import DecodeReplica
from br_serve.serve.wire.channel import MAGIC, ChannelError, decode_events, encode_events
from br_serve.serve.wire.messages import Admission, Admitted, StreamError
from br_serve.transport.base import KVHandle
from br_serve.transport.lease import KVLease
from tests.serve.helpers import RecordingTransport, fake_lease
from tests.serve.test_decode_step import FakeBarrier

KV_BYTES_PER_TOKEN = 4

_texts = st.text(alphabet=st.characters(codec=None), max_size=8)
_token = st.tuples(st.text(min_size=1, max_size=12), st.integers(0, 2**31), _texts,
                   st.integers(0, 10**6), st.booleans(), st.none() | st.just("length"))
_event = _token | st.builds(Admitted, st.text(max_size=12), st.integers(0, 255)) | \
    st.builds(StreamError, st.text(max_size=12), _texts, st.booleans())


@given(st.lists(_event, max_size=20))
def test_events_survive_a_frame_exactly(events: list[Any]) -> None:
    """Any texts (lone surrogates included: byte-level tokens), both message kinds."""
    data = encode_events(events)
    (n,) = struct.unpack(">I", data[:4])
    assert n == len(data) - 4
    assert decode_events(data[4:]) == events


def test_a_malformed_frame_is_a_channel_error() -> None:
    for bad in (msgpack.packb([(2, "x")]), msgpack.packb([("a", 1)]), b"\xc1"):
        with pytest.raises(ChannelError):
            decode_events(bad)


class _Local:
    """``handle.method.remote(*args)`` on an object living in this event loop."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        obj, calls = self.obj, self.calls

        class _M:
            @staticmethod
            def remote(*args: Any) -> Any:
                calls.append(name)
                return asyncio.ensure_future(getattr(obj, name)(*args))
        return _M


class _Sink:
    """Scheduler / prefill stand-in: answers anything with None."""

    def __getattr__(self, name: str) -> Any:
        class _M:
            @staticmethod
            def remote(*args: Any) -> Any:
                fut = asyncio.get_running_loop().create_future()
                fut.set_result(None)
                return fut
        return _M


def _world(channel_host: str | None = "127.0.0.1") -> tuple[DecodeReplica, _Local, Streamer]:
    rep = DecodeReplica(0, parse_graph_config(slots=8, step_b_s=0.002,
                                              engine_kv_bytes_per_token=KV_BYTES_PER_TOKEN),
                        "no-scheduler")
    rep.lease, _ = fake_lease(RecordingTransport())
    rep._tell_scheduler = lambda *a: True  # type: ignore[method-assign]
    handle = _Local(rep)
    cfg = parse_graph_config(replicas=1, slots=8, transport="objref")
    s = Streamer(cfg, _Sink(), _Sink(), [handle], KVLease(None, keeper=_Sink()),
                 channel_host=channel_host)
    return rep, handle, s


def _stop(rep: DecodeReplica) -> None:
    asyncio.run(rep.shutdown())
    rep._thread.join(5)


async def _admit(rep: DecodeReplica, s: Streamer, rid: str, tokens: int) -> Inbox:
    inbox = Inbox()
    s._queues[rid] = inbox
    s._placement[rid] = 0
    kv = KVHandle("fake", rid, 10 * KV_BYTES_PER_TOKEN)
    reply = await rep.admit(Admission(rid, s.owner, 10, 7, SamplingParams(max_tokens=tokens),
                                      kv))
    assert reply.status == "queued"
    return inbox


async def _collect(inbox: Inbox, tokens: int, timeout_s: float = 20.0) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got += await inbox.take(0.2)
        if any(type(e) is tuple and e[4] for e in got) or any(
                isinstance(e, (StreamError, _Lost)) for e in got):
            break
    return got


def _check_stream(got: list[Any], rid: str, tokens: int) -> None:
    assert isinstance(got[0], Admitted) and got[0].request_id == rid
    toks = got[1:]
    assert [t[3] for t in toks] == list(range(1, tokens))  # token 0 came from prefill
    assert all(t[0] == rid for t in toks) and toks[-1][4] and toks[-1][5] == "length"


def test_streams_arrive_whole_and_in_order_over_the_channel() -> None:
    rep, handle, s = _world()
    try:
        async def go() -> None:
            s._ensure_started()
            inboxes = {}
            # the first request is admitted before the channel exists (polled), the
            # others while the hand-over happens and after it
            for i in range(6):
                inboxes[f"r{i}"] = await _admit(rep, s, f"r{i}", 40 + 10 * i)
                if i == 0:
                    with rep._lock:
                        rep._barrier = FakeBarrier()  # type: ignore[assignment]
                        rep._wake_step.notify_all()
                await asyncio.sleep(0.05)
            for i in range(6):
                _check_stream(await _collect(inboxes[f"r{i}"], 40 + 10 * i), f"r{i}",
                              40 + 10 * i)
            assert rep._channels.open_count() == 1
            # after the hand-over the poll only shows liveness: far fewer polls than steps
            assert handle.calls.count("poll") < rep.core.step / 5
            await s.close()
        asyncio.run(go())
    finally:
        _stop(rep)


def test_a_channel_that_cannot_connect_falls_back_to_polling() -> None:
    rep, _, s = _world()
    try:
        async def go() -> None:
            s._ensure_started()
            await asyncio.sleep(0.1)
            assert s._channel is not None
            await s._channel.close()  # nothing listens any more: connect is refused
            assert s._channel_spec is not None
            s._channel_spec = ("127.0.0.1", _free_port(), s._channel_spec[2])
            inbox = await _admit(rep, s, "r", 60)
            with rep._lock:
                rep._barrier = FakeBarrier()  # type: ignore[assignment]
                rep._wake_step.notify_all()
            _check_stream(await _collect(inbox, 60), "r", 60)
            assert rep._channels.open_count() == 0 and not rep._channels.pushing(s.owner)
            await s.close()
        asyncio.run(go())
    finally:
        _stop(rep)


def test_a_wrong_token_is_refused() -> None:
    rep, _, s = _world()
    try:
        async def go() -> None:
            s._ensure_started()
            await asyncio.sleep(0.1)
            assert s._channel_spec is not None
            host, port, token = s._channel_spec
            inbox = Inbox()
            s._queues["x"] = inbox
            _, w = await asyncio.open_connection(host, port)
            hello = msgpack.packb((MAGIC, "0" * len(token), 0, "inc", 0))
            w.write(struct.pack(">I", len(hello)) + hello)
            w.write(encode_events([("x", 1, "a", 1, True, "length")]))
            await w.drain()
            await asyncio.sleep(0.3)
            assert await inbox.take(0.01) == [] and s._chan_conn == {}
            w.close()
            await s.close()
        asyncio.run(go())
    finally:
        _stop(rep)


def test_a_broken_channel_makes_the_replica_lost() -> None:
    """Frames in flight may be gone: the streams on that replica re-prefill (``_Lost``)."""
    rep, _, s = _world()
    try:
        async def go() -> None:
            s._ensure_started()
            inbox = await _admit(rep, s, "r", 10**6)
            with rep._lock:
                rep._barrier = FakeBarrier()  # type: ignore[assignment]
                rep._wake_step.notify_all()
            deadline = time.monotonic() + 10
            while rep._channels.open_count() == 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert rep._channels.open_count() == 1
            pusher = rep._channels._pushers[s.owner]
            assert pusher.task is not None
            pusher.task.cancel()  # its connection closes mid-stream
            got = await _collect(inbox, 10**6)
            assert isinstance(got[-1], _Lost) and 0 in s._dead
            await s.close()
        asyncio.run(go())
    finally:
        _stop(rep)


def _free_port() -> int:
    from tests.serve.helpers import free_port

    return free_port()


def test_the_wire_tokens_equal_what_the_engine_produced() -> None:
    """Tokens decoded from a frame are the same tuples the poll returned (types too)."""
    t = ("rid", np.int64(5).item(), "é\udcff", 3, False, None)
    (back,) = decode_events(encode_events([t])[4:])
    assert back == t and type(back) is tuple and [type(x) for x in back] == [
        type(x) for x in t]


def test_a_report_survives_a_frame_exactly() -> None:
    from br_serve.serve.wire.channel import decode_reports, encode_report
    from br_serve.serve.wire.messages import ReplicaReport

    rep = ReplicaReport(replica=3, generation=2, step=17, load_tokens=900,
                        running_ids=("a", "b"), prompt_tokens=(400, 480),
                        decoded_tokens=(9, 11), finished_ids=("c",),
                        finished_output_tokens=(30,), members=(0, 3),
                        barrier_loads=(800, 900), barrier_running=(2, 2), compute_s=0.0123,
                        barrier_s=0.004, dropped_ids=("d",), incarnation="inc",
                        barrier_step=5, full=False, barrier_flags=(0, 1),
                        barrier_compute_s=(0.01, 0.0123))
    assert decode_reports(encode_report(rep)[4:]) == [rep]


class _RaySched:
    """What ``_sched()`` returns in the fallback test: records Ray-path reports."""

    def __init__(self) -> None:
        self.reports: list[Any] = []
        outer = self

        class _Report:
            @staticmethod
            def remote(rep: Any) -> None:
                outer.reports.append(rep)
        self.report = _Report


def test_reports_go_over_the_report_channel_and_fall_back_to_ray_when_it_breaks() -> None:
    from br_serve.serve.wire.channel import ChannelServer, decode_reports

    rep = DecodeReplica(0, parse_graph_config(slots=8, step_b_s=0.002,
                                              engine_kv_bytes_per_token=KV_BYTES_PER_TOKEN),
                        "no-scheduler")
    rep.lease, _ = fake_lease(RecordingTransport())
    ray_sched = _RaySched()
    rep._sched = lambda: ray_sched  # type: ignore[method-assign]
    got: list[Any] = []
    conns: list[object] = []

    async def ready(g: int, _k: int, conn: object) -> bool:
        conns.append(conn)
        return True

    try:
        async def go() -> None:
            server = ChannelServer("127.0.0.1", ready, lambda g, c, reps: got.extend(reps),
                                   lambda g, c: None, decode=decode_reports)
            spec = await server.start()
            s = Streamer(parse_graph_config(replicas=1, slots=8, transport="objref"),
                         _Sink(), _Sink(), [_Local(rep)], KVLease(None, keeper=_Sink()))
            await rep.report_to(spec)
            await asyncio.sleep(0.2)
            assert rep._reports is not None and rep._reports.state == "open"
            inbox = await _admit(rep, s, "r", 10**6)
            with rep._lock:
                rep._barrier = FakeBarrier()  # type: ignore[assignment]
                rep._wake_step.notify_all()
            deadline = time.monotonic() + 10
            while len(got) < 20 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert len(got) >= 20  # rank 0 of a busy group reports every step
            assert got[0].full and got[0].running_ids == ("r",)
            steps = [r.step for r in got]
            assert steps == sorted(steps) and len(set(steps)) == len(steps)
            assert not ray_sched.reports  # nothing went through Ray meanwhile
            await server.close()
            rep._reports.close()  # the scheduler went away: the channel is broken
            deadline = time.monotonic() + 10
            while len(ray_sched.reports) < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert len(ray_sched.reports) >= 3
            assert ray_sched.reports[0].full  # after a loss: the full state first
            del inbox
        asyncio.run(go())
    finally:
        _stop(rep)


def test_a_refused_hello_loses_nothing_and_polling_takes_over() -> None:
    """An owner that will not apply the channel (a stale or too slow hand-over) closes
    it unacknowledged: the replica took nothing from the outbox, so the poll delivers
    the whole stream."""
    rep, _, s = _world()

    async def refuse(g: int, poll_no: int, conn: object) -> bool:
        return False

    s._chan_ready = refuse  # type: ignore[method-assign]
    try:
        async def go() -> None:
            s._ensure_started()
            await asyncio.sleep(0.1)
            assert s._channel is not None
            s._channel._ready = refuse
            inbox = await _admit(rep, s, "r", 80)
            with rep._lock:
                rep._barrier = FakeBarrier()  # type: ignore[assignment]
                rep._wake_step.notify_all()
            _check_stream(await _collect(inbox, 80), "r", 80)
            assert rep._channels._pushers[s.owner].state == "failed"
            await s.close()
        asyncio.run(go())
    finally:
        _stop(rep)

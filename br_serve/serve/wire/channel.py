"""The channels: a decode replica's events for one owner (an ingress replica), and its
reports for the scheduler, each over one TCP stream instead of a Ray call per step.

A Ray actor call costs this 2-core host about 1 ms of CPU on each side (measured:
``benchmarks/rpc_cost.py``), so the ingress's long-poll of every decode replica after
every step was most of the graph's per-step CPU. Instead, an owner (an ingress
replica's :class:`~br_serve.serve.frontend.streams.Streamer`) listens on one TCP port and each
decode replica writes that owner's events to it as length-prefixed msgpack frames, as
vLLM's engine core does to its API server over ZeroMQ. The long-poll stays, once a
second, for liveness and as the fallback when a replica cannot connect.

Protocol (one connection per (replica, owner); after the hello only the replica
writes, the owner's one byte of acknowledgement aside):

- frame: 4-byte big-endian length, then a msgpack array;
- the first frame is the hello ``[MAGIC, token, replica, incarnation, poll_no]``:
  ``token`` is the owner's secret (128 random bits, handed to the replica inside the
  poll RPC, i.e. over Ray's own authenticated channel; a wrong one is dropped),
  ``poll_no`` the poll whose reply was the last batch taken by polling; the owner
  answers one byte ``ACK`` once it will apply the channel's frames (or closes: then
  the replica, which took nothing yet, goes back to being polled);
- every later frame is one batch of events: a token is its :data:`WireToken` array,
  an :class:`Admitted` is ``[0, request_id, replica]``, a :class:`StreamError`
  ``[1, request_id, message, retryable]``.

Ordering: the replica's outbox has one consumer at a time. The poll that hands over the
channel takes what is queued and starts the pusher; from then on only the pusher takes,
and the owner applies the channel's frames only after that poll's reply (``poll_no``),
so a stream's events arrive in the order the replica produced them. A connection that
breaks after it was open may have lost frames: the owner then treats the replica as
lost (its streams re-prefill) exactly as when a poll fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import logging
import operator
import secrets
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack

from br_serve.serve.wire.messages import Admitted, ReplicaReport, StreamError, WireEvent

log = logging.getLogger(__name__)

MAGIC = "br-events-1"
_LEN = struct.Struct(">I")
#: a frame above this is a protocol error (a batch is a few KB)
MAX_FRAME_BYTES = 64 << 20
#: bound on connecting and on the hello (then the replica falls back to polling)
CONNECT_S = 5.0
#: bound on the owner's acknowledgement (it first applies the poll the hello names,
#: whose reply may be slow on a loaded host)
ACK_S = 60.0
ACK = b"\x01"
#: ``(host, port, token)`` of an owner's channel, as it travels in a poll
ChannelSpec = tuple[str, int, str]


class ChannelError(Exception):
    """A malformed frame, a bad hello or a refused token."""


def frame(obj: Any) -> bytes:
    payload: bytes = msgpack.packb(obj, unicode_errors="surrogatepass")
    return _LEN.pack(len(payload)) + payload


def encode_events(events: list[WireEvent]) -> bytes:
    """One frame for ``events`` (tokens as they are; the two message kinds tagged)."""
    out: list[Any] = []
    for e in events:
        if type(e) is tuple:
            out.append(e)
        elif isinstance(e, Admitted):
            out.append((0, e.request_id, e.replica))
        elif isinstance(e, StreamError):
            out.append((1, e.request_id, e.message, e.retryable))
        else:
            raise TypeError(f"not an event: {e!r}")
    return frame(out)


def decode_events(payload: bytes) -> list[WireEvent]:
    """The events of one frame's payload (tokens come back as the same tuples)."""
    try:
        raw = msgpack.unpackb(payload, use_list=False, unicode_errors="surrogatepass")
    except (ValueError, msgpack.UnpackException) as exc:
        raise ChannelError(f"bad frame: {exc}") from exc
    out: list[WireEvent] = []
    for e in raw:
        tag = e[0] if type(e) is tuple and e else None
        if type(tag) is str and len(e) == 6:
            out.append(e)
        elif tag == 0 and len(e) == 3:
            out.append(Admitted(e[1], e[2]))
        elif tag == 1 and len(e) == 4:
            out.append(StreamError(e[1], e[2], bool(e[3])))
        else:
            raise ChannelError(f"bad event: {e!r}")
    return out


_REPORT_FIELDS = tuple(f.name for f in dataclasses.fields(ReplicaReport))
_report_tuple = operator.attrgetter(*_REPORT_FIELDS)


def encode_report(rep: ReplicaReport) -> bytes:
    """One frame for a report: its fields in declaration order."""
    return frame(_report_tuple(rep))


def decode_reports(payload: bytes) -> list[ReplicaReport]:
    try:
        fields = msgpack.unpackb(payload, use_list=False)
        return [ReplicaReport(*fields)]
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ChannelError(f"bad report: {exc}") from exc


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    """The next frame's payload. Raises EOF / connection errors, or ChannelError."""
    (n,) = _LEN.unpack(await reader.readexactly(_LEN.size))
    if n > MAX_FRAME_BYTES:
        raise ChannelError(f"frame of {n} bytes")
    return await reader.readexactly(n)


async def connect(spec: ChannelSpec, hello: tuple[Any, ...]
                  ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Open a channel: connect, send the hello, wait for the owner's ``ACK``.

    Raises:
        ChannelError: refused, unreachable, or not acknowledged in time.
    """
    host, port, token = spec
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port),
                                                CONNECT_S)
    except (OSError, TimeoutError) as exc:
        raise ChannelError(f"{type(exc).__name__}: {exc}") from exc
    try:
        writer.write(frame((MAGIC, token, *hello)))
        await asyncio.wait_for(writer.drain(), CONNECT_S)
        if await asyncio.wait_for(reader.readexactly(1), ACK_S) != ACK:
            raise ChannelError("not acknowledged")
    except (OSError, TimeoutError, asyncio.IncompleteReadError, ChannelError) as exc:
        writer.close()
        raise ChannelError(f"{type(exc).__name__}: {exc}") from exc
    return reader, writer


class Pusher:
    """Replica side: writes one owner's outbox to that owner's channel (runs on the
    replica actor's event loop). ``take()`` empties the outbox; :meth:`wake` says
    there is more. ``state``: ``connecting``, ``open``, ``failed`` (never connected:
    nothing was taken, polling may take over) or ``broken`` (it broke after taking:
    the owner will treat this replica as lost)."""

    def __init__(self, spec: ChannelSpec, hello: tuple[Any, ...],
                 take: Callable[[], list[WireEvent]]) -> None:
        self.spec = spec
        self._hello = hello
        self._take = take
        self._wake = asyncio.Event()
        self.state = "connecting"
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    def wake(self) -> None:
        self._wake.set()

    async def _run(self) -> None:
        host, port, _ = self.spec
        try:
            _, writer = await connect(self.spec, self._hello)
        except ChannelError as exc:
            log.warning("event channel to %s:%d: %s; polling instead", host, port, exc)
            self.state = "failed"  # nothing was taken: polling takes over
            return
        self.state = "open"
        log.info("event channel to %s:%d open", host, port)
        try:
            while True:
                events = self._take()
                if not events:
                    self._wake.clear()
                    events = self._take()  # an emit between the take and the clear
                    if not events:
                        await self._wake.wait()
                        continue
                writer.write(encode_events(events))
                await writer.drain()
        except (OSError, ConnectionError) as exc:
            log.warning("event channel to %s:%d broke: %s", host, port, exc)
            self.state = "broken"
        finally:
            writer.close()


class ChannelServer:
    """Owner side: accepts replicas' channels and hands their batches on.

    The scheduler runs one for the decode replicas' reports (``decode``:
    :func:`decode_reports`), each ingress replica one for its events.
    ``ready(replica, poll_no)`` returns once the owner has applied that replica's poll
    reply ``poll_no`` (and tells whether the connection may be used: False drops it);
    ``on_events(replica, conn, events)`` gets each batch; ``on_closed(replica, conn)``
    is called when an accepted connection ends (``conn`` identifies the connection).
    """

    def __init__(self, host: str, ready: Callable[[int, int, object], Awaitable[bool]],
                 on_events: Callable[[int, object, list[Any]], None],
                 on_closed: Callable[[int, object], None],
                 decode: Callable[[bytes], list[Any]] = decode_events) -> None:
        self.host = host
        self._decode = decode
        self.token = secrets.token_hex(16)
        self._ready = ready
        self._on_events = on_events
        self._on_closed = on_closed
        self._server: asyncio.AbstractServer | None = None
        self.port = 0

    async def start(self) -> ChannelSpec:
        self._server = await asyncio.start_server(self._serve, self.host, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.host, self.port, self.token

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        conn = object()
        replica = -1
        try:
            hello = msgpack.unpackb(await asyncio.wait_for(read_frame(reader), CONNECT_S),
                                    use_list=False)
            if (type(hello) is not tuple or len(hello) != 5 or hello[0] != MAGIC
                    or not isinstance(hello[1], str)
                    or not hmac.compare_digest(hello[1], self.token)):
                raise ChannelError("bad hello")
            replica, poll_no = int(hello[2]), int(hello[4])
            if not await self._ready(replica, poll_no, conn):
                return
            writer.write(ACK)
            await writer.drain()
            while True:
                self._on_events(replica, conn, self._decode(await read_frame(reader)))
        except (asyncio.IncompleteReadError, OSError, TimeoutError):
            pass  # closed: on_closed decides what it means
        except (ChannelError, ValueError, TypeError) as exc:
            log.warning("channel from replica %d: %s; closed", replica, exc)
        finally:
            writer.close()
            if replica >= 0:
                self._on_closed(replica, conn)
            with contextlib.suppress(Exception):
                await writer.wait_closed()


class OwnerChannels:
    """Replica side: the owners whose events go over a channel, one :class:`Pusher`
    each. ``take(owner)`` empties that owner's outbox."""

    def __init__(self, take: Callable[[str], list[WireEvent]]) -> None:
        self._take = take
        self._pushers: dict[str, Pusher] = {}

    def pushing(self, owner: str) -> bool:
        """Whether the channel (not polling) takes ``owner``'s events."""
        p = self._pushers.get(owner)
        return p is not None and p.state != "failed"

    def open_count(self) -> int:
        return sum(p.state == "open" for p in self._pushers.values())

    def can_open(self, owner: str) -> bool:
        return owner not in self._pushers  # a failed channel is not retried

    def broken(self, owner: str) -> bool:
        p = self._pushers.get(owner)
        return p is not None and p.state == "broken"

    def open(self, owner: str, spec: ChannelSpec, hello: tuple[Any, ...]
             ) -> list[WireEvent]:
        """Hand ``owner`` over to a channel: returns what is queued now (the reply of
        the poll that asked, ``hello``'s poll number) and starts the pusher."""
        first = self._take(owner)
        p = Pusher(spec, hello, lambda: self._take(owner))
        self._pushers[owner] = p
        p.start()
        return first

    def wake(self, owner: str) -> None:
        p = self._pushers.get(owner)
        if p is not None:
            p.wake()


class ReportPusher:
    """Replica side: reports to the scheduler over its channel (``send`` runs on the
    replica actor's loop, in the order the step thread handed them over). ``lost`` is
    set when a report could not be written: the step thread then sends its next one in
    full (the scheduler's mirror rebuilds that replica's rows from it)."""

    #: a scheduler this far behind is treated as gone (reports go through Ray again)
    MAX_BUFFER_BYTES = 8 << 20

    def __init__(self, spec: ChannelSpec, hello: tuple[Any, ...]) -> None:
        self.spec = spec
        self._hello = hello
        self.state = "connecting"
        self.lost = False
        self._writer: asyncio.StreamWriter | None = None
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        # keep the task: the loop holds only a weak reference to it
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        host, port, _ = self.spec
        try:
            reader, writer = await connect(self.spec, self._hello)
        except ChannelError as exc:
            log.warning("report channel to %s:%d: %s; reporting through Ray", host, port,
                        exc)
            self.state = "failed"
            return
        self._writer, self.state = writer, "open"
        with contextlib.suppress(OSError, ConnectionError):
            await reader.read()  # the scheduler never writes: this returns at close
        self.close()

    def send(self, data: bytes) -> None:
        w = self._writer
        if (self.state != "open" or w is None or w.is_closing()
                or w.transport.get_write_buffer_size() > self.MAX_BUFFER_BYTES):
            self.lost = True
            self.close()
            return
        w.write(data)

    def close(self) -> None:
        if self.state == "open":  # what it wrote last may not have arrived
            self.state, self.lost = "broken", True
        if self._writer is not None:
            self._writer.close()

"""Pool entries of one ingress replica go to the scheduler together when they are ready
together: one ``submit_many`` call for the entries of one event-loop turn (a burst's
prefills come back in clusters), instead of one Ray call each.

A batch of one is a plain ``submit``. A failed call (``GenerateError`` from
``_call_scheduler``: the scheduler stayed unreachable) fails every entry of its batch,
each as its own call would have. The call runs in an empty context, so the client of
one request in the batch going away (Serve cancels that request's task and, through
Ray, its child calls) does not cancel the others' submission.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from typing import Any

from br_serve.serve.wire.messages import Admission

#: ``call(method, *args)``: the Streamer's ``_call_scheduler``
SchedulerCall = Callable[..., Awaitable[Any]]


class SubmitBatcher:
    """See the module docstring. ``batches``: how many calls carried how many entries
    (for tests and logs)."""

    def __init__(self, call: SchedulerCall) -> None:
        self._call = call
        self._queue: list[tuple[Admission, asyncio.Future[Any]]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.batches: list[int] = []

    async def submit(self, entry: Admission) -> Any:
        """The scheduler's status for ``entry`` (as ``Scheduler.submit``)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._queue.append((entry, fut))
        if len(self._queue) == 1:
            contextvars.Context().run(loop.call_soon, self._flush)
        return await fut

    def _flush(self) -> None:
        batch, self._queue = self._queue, []
        if not batch:
            return
        task = asyncio.get_running_loop().create_task(self._send(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[tuple[Admission, asyncio.Future[Any]]]) -> None:
        self.batches.append(len(batch))
        try:
            if len(batch) == 1:
                statuses = [await self._call("submit", batch[0][0])]
            else:
                statuses = list(await self._call("submit_many", [e for e, _ in batch]))
        except asyncio.CancelledError:  # (shut down): nobody waits for ever
            for _, fut in batch:
                fut.cancel()
            raise
        except Exception as exc:  # each caller gets it, as from its own call
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            return
        for (_, fut), status in zip(batch, statuses, strict=True):
            if not fut.done():  # (its request may have been cancelled meanwhile)
                fut.set_result(status)

"""An SSE response that closes its body generator however the response ends.

Starlette's ``StreamingResponse`` iterates its body with ``async for`` and never closes
it: a response cancelled (Serve's cancellation when the client goes away) or told of a
disconnect while a chunk is being sent leaves the body generator suspended at its
``yield``. Its ``finally`` clauses, where the ingress gives the request up (the decode
slot's abort, the pool entry, the KV), then run only when the garbage collector
finalizes the generator, which may be seconds later or, while an exception's traceback
keeps it alive, much later. Meanwhile the decode replica keeps decoding for nobody.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


class ClosingStreamingResponse(StreamingResponse):
    """``StreamingResponse`` over an async generator that is closed (``aclose``) when
    the response ends: finished, failed, disconnected or cancelled."""

    def __init__(self, content: AsyncGenerator[str, None], media_type: str) -> None:
        super().__init__(content, media_type=media_type)
        self._body = content

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # a no-op for a generator that ran to its end; else its finally runs now
            await self._body.aclose()

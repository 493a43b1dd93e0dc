"""How an ingress replica gets a request prefilled: through the Prefill deployment
(local engines), or by calling the remote prefill servers itself (``engine=vllm|sglang``).

Remote engines: the ingress replica owns a
:class:`~br_serve.serve.prefill.remote.RemotePrefiller` and calls it in its own event
loop (async httpx), so the request goes from the ingress to the prefill server and then
straight to the pool: no Prefill-deployment round trip and no awaited keeper ``hold``
before the pool (each cost 10-20 ms of a loaded core per request, and a burst queued
through them). The ticket's hold goes to the keeper in the background
(``KVLease.hold_soon``, one call per event-loop turn).

What still frees an engine-side prefill when things go wrong:

- the ingress gives a request up (client gone, pool full, no replica): it releases the
  ticket through its lease, as before; the keeper frees the engine's hold (vLLM
  ``cancel``, SGLang ``abort_request``), also when the release overtook the hold;
- the ingress replica dies: an SGLang prefill call is an open connection of that
  process, and the engine aborts a request whose client disconnected (SGLang does, and
  so does the emulator), freeing the room; a vLLM prefill has already answered, and its
  ticket is held by the keeper (freed at ``pool_ttl_s``, or taken by a decode replica
  if it reached the pool), except for a ticket whose hold was still queued (one
  event-loop turn), which only the engine's own timeout frees (vLLM's connectors time
  out an unpulled KV: ``VLLM_NIXL_ABORT_REQUEST_TIMEOUT``, 480 s by default);
- the keeper is unreachable: the hold is lost (logged, ``KVLease.holds_lost``); the
  request goes on and a decode still takes the ticket; only a give-up after that
  relies on the engine's timeout. (Before, a request then got a 503.)
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from br_serve.engine.base import SamplingParams
from br_serve.serve.frontend.events import GenerateError
from br_serve.serve.wire.messages import PrefillOutput
from br_serve.serve.wire.rpc import GONE

if TYPE_CHECKING:
    from br_serve.serve.config import GraphConfig
    from br_serve.transport.lease import KVLease

log = logging.getLogger(__name__)

_PREFILL_TRIES = 3
_RETRY_S = 0.5


class Prefill:
    """One ingress replica's way to prefill. ``target``: the Prefill deployment's handle,
    or an object with ``async prefill(request_id, prompt, params)`` called in this loop
    (``in_process``: its tickets are unheld, and this hands them to the keeper)."""

    def __init__(self, target: Any) -> None:
        self.target = target
        self.in_process = not hasattr(getattr(target, "prefill", None), "remote")

    async def __call__(self, rid: str, prompt: str | list[int], params: SamplingParams,
                       lease: KVLease) -> PrefillOutput:
        """Prefill ``prompt``; a replica that dies mid-call, or a 503, is retried
        (bounded). Raises :class:`GenerateError` (the engine's 400 passed on, 503 for an
        engine down, 502 for a bad answer)."""
        for attempt in range(_PREFILL_TRIES):
            last = attempt + 1 == _PREFILL_TRIES
            try:
                out: PrefillOutput = await (
                    self.target.prefill(rid, prompt, params) if self.in_process
                    else self.target.prefill.remote(rid, prompt, params))
            except GONE as exc:
                log.warning("ingress: prefill of %s failed (%s); attempt %d", rid, exc,
                            attempt + 1)
                if last:
                    raise GenerateError(503, f"prefill unavailable: {exc}",
                                        "service_unavailable") from exc
                await asyncio.sleep(_RETRY_S)
                continue
            # 503: the engine (or the deployment's KV keeper) was unreachable
            if out.error_status != 503 or last:
                break
            await asyncio.sleep(_RETRY_S)
        if out.error is not None:
            raise GenerateError(out.error_status, out.error,
                                "service_unavailable" if out.error_status == 503
                                else "invalid_request_error",
                                param=None)  # the ingress names "prompt" for its 400s
        if self.in_process and out.kv is not None:
            lease.hold_soon(out.kv)  # off the path: the pool entry goes in now
        return out


async def make_prefill(handle: Any, cfg: GraphConfig) -> Prefill:
    """The ingress's :class:`Prefill`: over ``handle`` (the Prefill deployment), or,
    with ``handle`` None (remote engines: the graph deploys no Prefill), over a
    :class:`~br_serve.serve.prefill.remote.RemotePrefiller` of this replica's own.

    Raises:
        RuntimeError: a remote prefill URL does not answer ``/health`` (named).
    """
    if handle is not None:
        return Prefill(handle)
    from br_serve.serve.prefill.remote import RemotePrefiller

    return Prefill(await asyncio.to_thread(RemotePrefiller, cfg))

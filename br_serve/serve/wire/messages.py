"""Plain-data messages between the ingress, prefill, scheduler and decode replicas.

All frozen, slotted dataclasses (they travel through Ray calls by pickling).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from br_serve.engine.base import SamplingParams, TokenEvent
from br_serve.transport.base import KVHandle


@dataclass(frozen=True, slots=True)
class PrefillOutput:
    """What a prefill returns (the Prefill deployment, or the ingress's own remote
    call). ``error`` set means nothing else is valid.

    ``error_status`` is the HTTP status the ingress should answer with (400).
    """

    request_id: str
    prompt_tokens: int = 0
    first_token_id: int = 0
    first_token_text: str = ""
    finished: bool = False
    finish_reason: str | None = None
    kv: KVHandle | None = None
    error: str | None = None
    error_status: int = 0
    prefill_s: float = 0.0
    first_token_pending: bool = False


@dataclass(frozen=True, slots=True)
class Admission:
    """A prefilled request on its way to a decode replica (a pool entry plus its KV).

    ``owner`` names the ingress replica that streams it; ``max_tokens`` in ``params``
    counts the prefill token too.
    """

    request_id: str
    owner: str
    prompt_tokens: int
    first_token_id: int
    params: SamplingParams
    kv: KVHandle
    arrival_s: float = 0.0
    prefix_hash: int | None = None


#: ``DecodeReplica.admit``'s answer: ``queued`` (taken; its KV is here), ``duplicate``
#: (taken before: resubmission is idempotent), ``full`` (refused: no free slot; the KV is
#: untouched, retry elsewhere), ``failed`` (its KV could not be pulled: it will never run;
#: the owner was told with a retryable :class:`StreamError`).
AdmitStatus = Literal["queued", "duplicate", "full", "failed"]


@dataclass(frozen=True, slots=True)
class AdmitReply:
    """What a decode replica answered to ``admit``.

    ``step`` is the replica's step counter when it took the request: a ``queued`` request
    is accounted for (running, finished or dropped) in every report of that replica
    incarnation with ``step >= AdmitReply.step + 2`` (it is installed at the start of
    the next step that begins after the answer). ``incarnation`` names the replica actor
    instance that answered.
    """

    status: AdmitStatus
    step: int = 0
    incarnation: str = ""

    @property
    def taken(self) -> bool:
        return self.status in ("queued", "duplicate")


@dataclass(frozen=True, slots=True)
class Admitted:
    """Decode replica ``replica`` installed ``request_id`` (sent before its tokens)."""

    request_id: str
    replica: int


@dataclass(frozen=True, slots=True)
class StreamError:
    """``request_id`` ended on the decode side without finishing (explained in ``message``)."""

    request_id: str
    message: str
    retryable: bool = False


StreamEvent = TokenEvent | Admitted | StreamError

#: A token on its way from a decode replica to its owner:
#: ``(request_id, token_id, text, index, finished, finish_reason)``. A plain tuple, for
#: speed: every step sends one per running request, and a frozen dataclass costs about
#: twenty times as much to pickle.
WireToken = tuple[str, int, str, int, bool, "str | None"]
#: What ``DecodeReplica.poll`` returns items of.
WireEvent = WireToken | Admitted | StreamError


def wire_token(e: TokenEvent) -> WireToken:
    return (e.request_id, e.token_id, e.text, e.index, e.finished, e.finish_reason)


@dataclass(frozen=True, slots=True)
class ReplicaReport:
    """One decode replica's state after one step (the scheduler's mirror input).

    A **full** report (``full=True``) lists every running request in rows
    ``running_ids[j]``, ``prompt_tokens[j]``, ``decoded_tokens[j]``; a **delta** lists
    only the requests installed since the previous report there (the mirror advances
    the others itself: every running request decodes one token per step). Both list
    ``finished_ids`` (with ``finished_output_tokens``) and ``dropped_ids`` since the
    previous report: dropped requests were taken (``admit`` answered ``queued``) and
    ended without finishing (aborted by their owner, refused by the engine at install).
    A replica sends a report only when it has something to say (a change, its periodic
    full state, a keep-alive), except the group's rank 0, which reports every busy step.

    ``incarnation`` names the replica actor instance (a replacement starts at step 0).
    ``barrier_step`` counts the exchanges of ``generation`` so far: the same number on
    every member after the same step (lock-step), unlike ``step``. Rank 0's reports
    carry the step's all-reduce for every member of ``members`` (replica indices, rank
    order): ``barrier_loads`` (the load each member's step computed with),
    ``barrier_running`` (its running requests, i.e. the tokens it produced) and
    ``barrier_flags`` (1 where that member sends a report for this step) and, when the
    policy calibrates step costs online, ``barrier_compute_s`` (the compute time each
    member measured for this step, barrier wait excluded); other members leave them
    empty.
    """

    replica: int
    generation: int
    step: int
    load_tokens: int
    running_ids: tuple[str, ...]
    prompt_tokens: tuple[int, ...]
    decoded_tokens: tuple[int, ...]
    finished_ids: tuple[str, ...]
    finished_output_tokens: tuple[int, ...]
    members: tuple[int, ...]
    barrier_loads: tuple[int, ...]
    barrier_running: tuple[int, ...]
    compute_s: float
    barrier_s: float
    dropped_ids: tuple[str, ...] = ()
    incarnation: str = ""
    barrier_step: int = 0
    full: bool = True
    barrier_flags: tuple[int, ...] = ()
    barrier_compute_s: tuple[float, ...] = ()

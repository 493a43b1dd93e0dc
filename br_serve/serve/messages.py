"""Plain-data messages between the ingress, prefill, scheduler and decode replicas.

All frozen, slotted dataclasses (they travel through Ray calls by pickling).
"""

from __future__ import annotations

from dataclasses import dataclass

from br_serve.engine.base import SamplingParams, TokenEvent
from br_serve.transport.base import KVHandle


@dataclass(frozen=True, slots=True)
class PrefillOutput:
    """What the prefill deployment returns. ``error`` set means nothing else is valid.

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


@dataclass(frozen=True, slots=True)
class ReplicaReport:
    """One decode replica's measured state after one step (the scheduler's mirror input).

    Rows ``running_ids[j]``, ``prompt_tokens[j]``, ``decoded_tokens[j]`` describe its
    running requests; ``finished_ids`` ended since the previous report.
    ``barrier_loads`` are the loads of ``members`` (replica indices, group rank order)
    *during* this step (what each member's step computed with), as the step's
    all-reduce delivered them; ``barrier_running`` their running counts during the step,
    i.e. the tokens each produced (both empty when no barrier ran).
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

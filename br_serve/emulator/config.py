"""The emulator's one configuration, validated at the edge and immutable afterwards.

Every error is a ``ValueError`` whose message starts with the bad field's CLI name.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from br_serve.emulator.core import StepModel

Protocol = Literal["vllm", "sglang"]
Role = Literal["prefill", "decode"]

#: The engines' own defaults for how long a prefill holds unpulled KV: vLLM's
#: VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT / VLLM_NIXL_ABORT_REQUEST_TIMEOUT (480 s) and
#: SGLang's SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT (300 s).
DEFAULT_KV_TTL_S = {"vllm": 480.0, "sglang": 300.0}
#: SGLang's decode waits SGLANG_DISAGGREGATION_WAITING_TIMEOUT (300 s) for its KV.
DEFAULT_BOOTSTRAP_WAIT_S = {"vllm": 0.0, "sglang": 300.0}


@dataclass(frozen=True, slots=True)
class EmulatorConfig:
    """One emulated engine server.

    Fields:
        protocol: ``vllm`` (vLLM / vllm-ascend OpenAI server with a KV connector) or
            ``sglang`` (SGLang OpenAI server in ``--disaggregation-mode``).
        role: ``prefill`` (``kv_producer``) or ``decode`` (``kv_consumer``).
        dp_size: data-parallel ranks served by this process (G).
        host: bind address (127.0.0.1 unless you mean to expose it).
        port: HTTP port; with ``port_per_rank`` rank g listens on ``port + g``.
        port_per_rank: vLLM external DP (one API server per ``--data-parallel-rank``),
            all ranks still stepping in lock-step in this process.
        advertise_host: host written into transfer parameters (default ``host``).
        bootstrap_port: SGLang prefill: an extra port serving the bootstrap (KV pull)
            endpoint, like ``--disaggregation-bootstrap-port`` (default: ``port``).
        model: the served model name (``--served-model-name``); requests must name it.
        step_a_s_per_token / step_b_s: the step model per rank (one value = all ranks).
        slots: most running requests per rank (``--max-num-seqs`` /
            ``--max-running-requests``); more wait.
        kv_limit_tokens: KV tokens per rank, the denominator of the usage gauges.
        prefill_p0_s / prefill_p1_s_per_token: prefill time ``p0 + p1 * S`` (S prompt tokens).
        kv_ttl_s: how long a prefill holds KV nobody pulled before releasing it.
        bootstrap_wait_s: how long a decode waits for its KV to appear at the twin.
        twin_timeout_s: HTTP timeout of one call from a decode to its prefill twin.
        api_key: if set, ``/v1/*`` and ``/emulator/*`` need ``Authorization: Bearer``.
        strict_fields: refuse request fields the emulator does not model (400 naming
            the field). Off by default, as the real engines: vLLM accepts an unknown
            field and logs it (at debug level in recent releases), SGLang's request
            models ignore it; the emulator logs it at debug level and counts it by name
            in ``/emulator/stats`` (``ignored_fields``). The project's own tests turn it
            on so that a field the router sends by mistake fails loudly.
        enable_fault_injection: serve ``POST /emulator/fault`` (drop / stall a rank).
        engine_id: the KV connector's engine id (default derived from role and port).
        block_size: KV block size in tokens (for ``remote_block_ids``).
        vocab_size: token ids are drawn in ``[0, vocab_size)``.
    """

    protocol: Protocol
    role: Role
    dp_size: int
    port: int
    host: str = "127.0.0.1"
    port_per_rank: bool = False
    advertise_host: str | None = None
    bootstrap_port: int | None = None
    model: str = "emulated"
    step_a_s_per_token: tuple[float, ...] = (5e-7,)
    step_b_s: tuple[float, ...] = (0.03,)
    slots: int = 256
    kv_limit_tokens: int = 1_000_000
    prefill_p0_s: float = 0.0
    prefill_p1_s_per_token: float = 0.0
    kv_ttl_s: float | None = None
    bootstrap_wait_s: float | None = None
    twin_timeout_s: float = 5.0
    api_key: str | None = None
    strict_fields: bool = False
    enable_fault_injection: bool = False
    engine_id: str | None = None
    block_size: int = 128
    kv_store_dir: str | None = None
    vocab_size: int = 32000
    _model: StepModel = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.protocol not in ("vllm", "sglang"):
            raise ValueError(f"--protocol: must be vllm or sglang (got {self.protocol!r})")
        if self.role not in ("prefill", "decode"):
            raise ValueError(f"--role: must be prefill or decode (got {self.role!r})")
        _check(self.dp_size >= 1, "--dp-size", "must be >= 1", self.dp_size)
        last = self.port + (self.dp_size - 1 if self.port_per_rank else 0)
        _check(self.port >= 1 and last <= 65535, "--port", "ports must lie in 1..65535",
               self.port)
        if self.kv_store_dir is not None:
            if self.protocol != "vllm":
                raise ValueError("--kv-store-dir: a prompt-keyed connector is the vllm "
                                 "protocol's (SGLang moves KV by bootstrap room)")
            if not os.path.isdir(self.kv_store_dir):
                raise ValueError(f"--kv-store-dir: {self.kv_store_dir!r} is not a directory")
        if self.port_per_rank and self.protocol != "vllm":
            raise ValueError("--port-per-rank: only the vllm protocol has one API server "
                             "per DP rank (SGLang pins ranks with routed_dp_rank)")
        if self.bootstrap_port is not None:
            _check(self.protocol == "sglang" and self.role == "prefill", "--bootstrap-port",
                   "only an sglang prefill server has a bootstrap port", self.bootstrap_port)
            _check(1 <= self.bootstrap_port <= 65535 and self.bootstrap_port != self.port,
                   "--bootstrap-port", "must be a port other than --port", self.bootstrap_port)
        a = _per_rank(self.step_a_s_per_token, self.dp_size, "--step-a-s-per-token")
        b = _per_rank(self.step_b_s, self.dp_size, "--step-b-s")
        object.__setattr__(self, "step_a_s_per_token", a)
        object.__setattr__(self, "step_b_s", b)
        object.__setattr__(self, "_model", StepModel(a, b))
        _check(self.slots >= 1, "--slots", "must be >= 1", self.slots)
        _check(self.kv_limit_tokens >= 1, "--kv-limit-tokens", "must be >= 1",
               self.kv_limit_tokens)
        _check(self.prefill_p0_s >= 0, "--prefill-p0-s", "must be >= 0",
               self.prefill_p0_s)
        _check(self.prefill_p1_s_per_token >= 0, "--prefill-p1-s-per-token",
               "must be >= 0", self.prefill_p1_s_per_token)
        if self.kv_ttl_s is None:
            object.__setattr__(self, "kv_ttl_s", DEFAULT_KV_TTL_S[self.protocol])
        _check(self.ttl_s > 0, "--kv-ttl-s", "must be > 0", self.kv_ttl_s)
        if self.bootstrap_wait_s is None:
            object.__setattr__(self, "bootstrap_wait_s",
                               DEFAULT_BOOTSTRAP_WAIT_S[self.protocol])
        _check(self.wait_s >= 0, "--bootstrap-wait-s", "must be >= 0", self.bootstrap_wait_s)
        _check(self.twin_timeout_s > 0, "--twin-timeout-s", "must be > 0",
               self.twin_timeout_s)
        _check(self.block_size >= 1, "--block-size", "must be >= 1", self.block_size)
        _check(self.vocab_size >= 2, "--vocab-size", "must be >= 2", self.vocab_size)
        _check(bool(self.model), "--model", "must not be empty", self.model)
        if self.api_key is not None:
            _check(bool(self.api_key), "--api-key", "must not be empty", self.api_key)
        if self.engine_id is None:
            object.__setattr__(self, "engine_id", f"emu-{self.role}-{self.port}")

    @property
    def step_model(self) -> StepModel:
        return self._model

    @property
    def ttl_s(self) -> float:
        assert self.kv_ttl_s is not None
        return self.kv_ttl_s

    @property
    def wait_s(self) -> float:
        assert self.bootstrap_wait_s is not None
        return self.bootstrap_wait_s

    @property
    def public_host(self) -> str:
        if self.advertise_host:
            return self.advertise_host
        return "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host

    def ports(self) -> list[int]:
        """Every HTTP port this process listens on (rank ports, then bootstrap)."""
        ports = ([self.port + g for g in range(self.dp_size)] if self.port_per_rank
                 else [self.port])
        if self.bootstrap_port is not None:
            ports.append(self.bootstrap_port)
        return ports


def _per_rank(values: Sequence[float], dp_size: int, name: str) -> tuple[float, ...]:
    vals = tuple(float(v) for v in values)
    if len(vals) == 1:
        vals = vals * dp_size
    if len(vals) != dp_size:
        raise ValueError(f"{name}: need 1 or {dp_size} values (one per rank), "
                         f"got {len(vals)}")
    if min(vals) < 0:
        raise ValueError(f"{name}: must be >= 0 (got {list(vals)})")
    return vals


def _check(ok: bool, name: str, why: str, got: object) -> None:
    if not ok:
        raise ValueError(f"{name}: {why} (got {got!r})")

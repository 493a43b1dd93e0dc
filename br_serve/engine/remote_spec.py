"""Configuration of remote PD engines (vLLM / vllm-ascend, SGLang) behind the graph.

The graph's ``remote`` section: with ``engine.name=vllm`` or ``sglang`` the graph runs
no model itself. Its ingress replicas call ``remote.prefill_urls`` and each decode
replica actor proxies one DP rank: ``decode_urls[g]`` (one server per rank, vLLM's
"external DP"), or the single ``decode_urls[0]`` with the rank pinned per request (vLLM:
the ``X-data-parallel-rank`` header; SGLang: ``routed_dp_rank``) when ``dp_size`` is
given.
The contracts are in docs/engine-contracts.md.
"""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from br_serve.remote.requests import KEEPALIVE_S

#: The engines that run outside the graph.
REMOTE_ENGINES = ("vllm", "sglang")

#: How a vLLM decode server finds the KV a prefill server computed.
KvHandoff = Literal["auto", "params", "prompt"]


def split_url(url: str) -> tuple[str, int]:
    """``(host, port)`` of ``http(s)://host:port`` (the default port of the scheme if
    none). Raises ``ValueError`` naming what is wrong."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r}: expected http://host:port")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"{url!r}: give the server's base URL, without a path")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{url!r}: bad port") from None
    return parts.hostname, port or (443 if parts.scheme == "https" else 80)


def _url_list(v: Any) -> Any:
    if isinstance(v, str):  # "http://a:1,http://a:2" from a command line
        return tuple(x.strip().rstrip("/") for x in v.split(",") if x.strip())
    if isinstance(v, list | tuple):
        return tuple(str(x).strip().rstrip("/") for x in v)
    return v


class RemoteConfig(BaseModel):
    """Where the remote engines are and how the graph talks to them. Frozen."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    prefill_urls: tuple[str, ...] = ()
    """vllm/sglang: base URLs of the prefill servers (comma-separated on a command line);
    each ingress replica spreads its requests over them round robin."""
    decode_urls: tuple[str, ...] = ()
    """vllm/sglang: one base URL per decode DP rank, or one URL for all ranks together
    with ``dp_size``."""
    dp_size: int | None = Field(default=None, ge=1, le=256)
    """vllm/sglang: DP ranks behind the single URL of ``decode_urls`` (pinned per
    request); unset: one URL per rank. Sets ``replicas``."""
    model: str | None = None
    """vllm/sglang: the model name sent to the engines (unset: the one model every
    prefill and decode server lists at ``GET /v1/models``, asked when the graph is
    built; servers that list different models are refused, naming them)."""
    kv_handoff: KvHandoff = "auto"
    """vllm: how the decode finds the prefill's KV. ``params``: the prefill answer must
    carry ``kv_transfer_params`` (NixlConnector, P2P Mooncake, vllm-ascend's connectors),
    which the decode request carries back. ``prompt``: the connector stores the KV keyed
    by the prompt (ExampleConnector, LMCache, store-based Mooncake); its prefill answer
    has ``kv_transfer_params: null`` and the decode request is the same prompt without
    them. ``auto``: each prefill answer decides (parameters present: ``params``, none:
    ``prompt``). SGLang moves KV by its bootstrap room: only ``auto`` applies."""
    api_key: str | None = None
    """vllm/sglang: bearer key of the engines' own ``--api-key``."""
    bootstrap_port: int | None = Field(default=None, ge=1, le=65535)
    """sglang: the prefill servers' ``--disaggregation-bootstrap-port`` (unset: the
    port of each prefill URL, as the emulator serves it)."""
    connect_s: float = Field(default=3.0, gt=0)
    """vllm/sglang: bound on connecting to an engine."""
    first_token_s: float = Field(default=120.0, gt=0)
    """vllm/sglang: bound on a decode stream's first token (KV transfer included)."""
    stall_s: float = Field(default=30.0, gt=0)
    """vllm/sglang: most seconds between two chunks of a flowing decode stream."""
    keepalive_s: float = Field(default=KEEPALIVE_S, gt=0)
    """vllm/sglang: most seconds an idle pooled connection to an engine is reused. Keep
    it below the engines' server keep-alive timeout (uvicorn's 5 s unless changed, e.g.
    ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``): a request sent on a connection the server is
    closing at that moment is lost without an answer."""

    @field_validator("prefill_urls", "decode_urls", mode="before")
    @classmethod
    def _split(cls, v: Any) -> Any:
        return _url_list(v)

    @field_validator("prefill_urls", "decode_urls")
    @classmethod
    def _valid_urls(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for i, url in enumerate(v):
            try:
                split_url(url)
            except ValueError as exc:
                raise ValueError(f"[{i}] {exc}") from None
        if len(set(v)) != len(v):
            raise ValueError("a URL is listed twice")
        return v

    def check_remote(self, engine: str, replicas: int | None) -> int:
        """The replica count the remote layout implies (checked against ``replicas``
        when the caller gave one). Raises ``ValueError`` naming the field."""
        if not self.prefill_urls:
            raise ValueError(f"prefill_urls: required with engine.name={engine!r}")
        if not self.decode_urls:
            raise ValueError(f"decode_urls: required with engine.name={engine!r}")
        if self.dp_size is not None:
            if len(self.decode_urls) != 1:
                raise ValueError(f"dp_size: give one decode URL with dp_size "
                                 f"(got {len(self.decode_urls)})")
            ranks = self.dp_size
        else:
            if engine == "sglang" and len(self.decode_urls) != 1:
                raise ValueError("decode_urls: SGLang serves its DP ranks from one server; "
                                 "give one URL and dp_size")
            ranks = len(self.decode_urls)
        if engine == "sglang" and self.kv_handoff != "auto":
            raise ValueError(f"kv_handoff: {self.kv_handoff!r} is for vLLM; SGLang moves "
                             "the KV by its bootstrap room (leave it at 'auto')")
        if replicas is not None and replicas != ranks:
            raise ValueError(f"replicas: {replicas} does not match the {ranks} decode "
                             "ranks of remote.decode_urls / remote.dp_size (leave it out)")
        return ranks

    def decode_target(self, rank: int) -> tuple[str, int | None]:
        """``(base URL, rank to pin or None)`` of decode replica ``rank``."""
        if self.dp_size is not None:
            return self.decode_urls[0], rank
        return self.decode_urls[rank], None

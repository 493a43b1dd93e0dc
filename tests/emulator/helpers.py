"""Shared pieces of the emulator HTTP tests: servers on free ports, one PD request."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from br_serve.emulator.config import EmulatorConfig
from br_serve.emulator.server import EmulatorThread
from br_serve.engine.emulated import token_id, token_text
from br_serve.remote.client import RemoteEngineClient
from br_serve.remote.requests import (
    Bootstrap,
    endpoint_path,
    sglang_decode_request,
    vllm_decode_request,
)
from br_serve.remote.sse import Done, TokenChunk
from tests.serve.helpers import free_port


def expected_texts(prompt: str, max_tokens: int, seed: int | None = None) -> list[str]:
    """What the emulator emits: tokens of ``(seed, prompt_tokens + i)``."""
    s = seed if seed is not None else zlib.crc32(prompt.encode())
    n = len(prompt.split())
    return [token_text(token_id(s, n + i)) for i in range(max_tokens)]


@contextmanager
def servers(*configs: EmulatorConfig) -> Iterator[list[EmulatorThread]]:
    threads = [EmulatorThread(c) for c in configs]
    try:
        for t in threads:
            t.start()
        yield threads
    finally:
        for t in threads:
            t.stop()


def config(protocol: str, role: str, dp_size: int = 1, **kw: Any) -> EmulatorConfig:
    kw.setdefault("step_b_s", (0.002,))
    kw.setdefault("step_a_s_per_token", (0.0,))
    # the project's own tests run strict: a field a router sends by mistake fails loudly
    kw.setdefault("strict_fields", True)
    return EmulatorConfig(protocol, role, dp_size, free_port(), **kw)  # type: ignore[arg-type]


@dataclass
class Outcome:
    texts: list[str] = field(default_factory=list)
    completion_tokens: int = 0
    done: Done | None = None
    prefill_text: str | None = None


async def vllm_pd(client: RemoteEngineClient, prefill_url: str, decode_url: str,
                  body: dict[str, Any], rid: str, rank: int | None) -> Outcome:
    pre = await client.vllm_prefill(prefill_url, body, rid)
    assert pre.kv_transfer_params is not None
    dbody, headers = vllm_decode_request(body, pre.kv_transfer_params, rid, rank)
    out = Outcome(prefill_text=pre.text)
    async for ev in client.stream(decode_url + endpoint_path(False), dbody, headers):
        if isinstance(ev, TokenChunk):
            out.texts.append(ev.text)
            out.completion_tokens = ev.completion_tokens
        elif isinstance(ev, Done):
            out.done = ev
    return out


async def sglang_pd(client: RemoteEngineClient, prefill_url: str, decode_url: str,
                    bootstrap: Bootstrap, body: dict[str, Any], rid: str,
                    rank: int | None) -> Outcome:
    prefill = asyncio.ensure_future(client.sglang_prefill(prefill_url, body, bootstrap, rid))
    out = Outcome()
    try:
        dbody = sglang_decode_request(body, bootstrap, rid, rank)
        async for ev in client.stream(decode_url + endpoint_path(False), dbody):
            if isinstance(ev, TokenChunk):
                out.texts.append(ev.text)
                out.completion_tokens = ev.completion_tokens
            elif isinstance(ev, Done):
                out.done = ev
        out.prefill_text = (await prefill).text
    finally:
        prefill.cancel()
    return out

"""The field's real routers in front of the engine emulator, started as a user would.

Each router binary (the ``[peers]`` extra's wheels) starts against a prefill and a decode
emulator run with their defaults (no lenient flag: the emulator accepts unknown fields,
as vLLM and SGLang do), and 100 concurrent streams through it must all complete with
exactly the tokens the engine produces. A router whose wheel is not installed is skipped
with the reason. Ray-free.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from br_serve.bench.peers_routers import ARMS, Arm, router_available, running_router
from br_serve.emulator.config import EmulatorConfig
from tests.emulator.helpers import expected_texts, servers
from tests.serve.helpers import free_port

G = 4
STREAMS = 100
MAX_TOKENS = 12


def _engines(protocol: str) -> tuple[EmulatorConfig, EmulatorConfig]:
    # the emulators' defaults (strict_fields off, as the engines), a fast step
    pre = EmulatorConfig(protocol, "prefill", 1, free_port())  # type: ignore[arg-type]
    dec = EmulatorConfig(protocol, "decode", G, free_port(),  # type: ignore[arg-type]
                         step_a_s_per_token=(0.0,), step_b_s=(0.01,), slots=32)
    return pre, dec


async def _stream(client: httpx.AsyncClient, i: int) -> tuple[list[str], list[str]]:
    prompt = " ".join(f"w{i}" for _ in range(3 + i % 7))
    body = {"model": "emulated", "prompt": prompt, "max_tokens": MAX_TOKENS, "seed": i,
            "stream": True}
    got: list[str] = []
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.status_code == 200, (await resp.aread())[:300]
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev: dict[str, Any] = json.loads(line[6:])
            assert "error" not in ev, ev
            got += [c["text"] for c in ev.get("choices", []) if c.get("text")]
    return got, expected_texts(prompt, MAX_TOKENS, seed=i)


async def _many(url: str) -> list[tuple[list[str], list[str]]]:
    limits = httpx.Limits(max_connections=STREAMS + 10)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        return await asyncio.gather(*(_stream(client, i) for i in range(STREAMS)))


def _run(arm: Arm, tmp_path: Path, dp_aware: bool | None = None) -> dict[str, Any]:
    why = router_available(arm.router)
    if why is not None:
        pytest.skip(why)
    assert arm.protocol is not None
    pre, dec = _engines(arm.protocol)
    with servers(pre, dec) as (p, d):
        log = tmp_path / f"{arm.router}.log"
        try:
            with running_router(arm, free_port(), p.url, d.url, G, "emulated", log,
                                dp_aware=dp_aware) as url:
                # counted from here: the readiness probes before are not the test's (a
                # probe that timed out on a loaded host may still have gone through)
                before = _counts(p.url, d.url)
                results = asyncio.run(_many(url))
                after = _counts(p.url, d.url)
        except Exception:
            print(log.read_text(errors="replace")[-4000:])
            raise
        stats: dict[str, Any] = httpx.get(f"{d.url}/emulator/stats").json()
        pstats = httpx.get(f"{p.url}/emulator/stats").json()
    for got, want in results:
        assert got == want  # exact: no token lost, duplicated or wrong
    assert stats["refused"] == {} and pstats["refused"] == {}
    # every KV the prefill held for these streams was pulled by the decode
    assert after["pulled"] - before["pulled"] == STREAMS and pstats["kv"]["held"] == 0
    stats["admitted_per_rank"] = [a - b for a, b in zip(after["admitted"], before["admitted"],
                                                        strict=True)]
    return stats


def _counts(prefill_url: str, decode_url: str) -> dict[str, Any]:
    pst = httpx.get(f"{prefill_url}/emulator/stats").json()
    dst = httpx.get(f"{decode_url}/emulator/stats").json()
    return {"pulled": pst["kv"]["released"]["pulled"],
            "admitted": [len(r["admitted"]) for r in dst["ranks"]]}


@pytest.mark.timeout(300)
def test_smg_dp_aware_pins_ranks_and_streams_exactly(tmp_path: Path) -> None:
    # smg reads dp_size from /server_info, one worker per rank, routed_dp_rank per request
    stats = _run(ARMS["smg:round_robin"], tmp_path)
    per_rank = stats["admitted_per_rank"]
    assert sum(per_rank) == STREAMS and min(per_rank) >= STREAMS // G - 1, per_rank
    assert stats["barrier"]["steps"] > 0


@pytest.mark.timeout(300)
def test_smg_minimum_tokens_rank_rule_reads_v1_loads(tmp_path: Path) -> None:
    stats = _run(ARMS["smg:min_tokens"], tmp_path)
    assert sum(stats["admitted_per_rank"]) == STREAMS


@pytest.mark.timeout(300)
def test_vllm_router_intra_node_dp_streams_exactly(tmp_path: Path) -> None:
    # vllm-router sends fields vLLM does not know (e.g. no_stop_trim): accepted, counted
    stats = _run(ARMS["vllm-router:round_robin"], tmp_path)
    per_rank = stats["admitted_per_rank"]
    assert sum(per_rank) == STREAMS and min(per_rank) >= STREAMS // G - 1, per_rank
    assert stats["ignored_fields"], "vllm-router sent no field vLLM does not know"


@pytest.mark.timeout(300)
def test_sglang_router_0_3_2_without_dp_awareness(tmp_path: Path) -> None:
    # 0.3.2's PD router with --dp-aware sends decodes to "http://host:port@rank" unsplit
    # (see br_serve/bench/peers_routers.py); without it the engine's DP controller
    # (round robin) places the decodes
    arm = Arm("sglang-router:round_robin", "sglang-router", "round_robin",
              ("--policy", "round_robin"), None)
    stats = _run(arm, tmp_path, dp_aware=False)
    assert sum(stats["admitted_per_rank"]) == STREAMS

"""The remote preflight (model discovery, health, the prefill answer's fit with
``remote.kv_handoff``) and the prompt-keyed hand-off, against the engine emulator over
HTTP (no Ray)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import httpx
import pytest

from br_serve.remote.client import RemoteEngineClient
from br_serve.remote.errors import EngineProtocolError
from br_serve.remote.preflight import PreflightError, pick_model, preflight
from br_serve.remote.requests import endpoint_path, vllm_decode_request
from br_serve.remote.sse import TokenChunk
from br_serve.remote.ticket import RemoteTicket
from tests.emulator.helpers import config, expected_texts, servers
from tests.serve.helpers import free_port


def test_discovers_the_one_model_every_engine_serves() -> None:
    with servers(config("vllm", "prefill", model="tiny-a"),
                 config("vllm", "decode", 2, model="tiny-a")) as (p, d):
        found = preflight("vllm", [p.url], [d.url], None, "auto")
    assert (found.model, found.kv_handoff) == ("tiny-a", "auto")


def test_engines_serving_different_models_are_refused_by_name() -> None:
    with servers(config("vllm", "prefill", model="tiny-a"),
                 config("vllm", "decode", model="tiny-b")) as (p, d), \
            pytest.raises(PreflightError) as err:
        preflight("vllm", [p.url], [d.url], None, "auto")
    msg = str(err.value)
    assert "serve different models" in msg, msg
    assert f"remote.prefill_urls[0] {p.url} serves ['tiny-a']" in msg, msg
    assert f"remote.decode_urls[0] {d.url} serves ['tiny-b']" in msg, msg


def test_a_named_model_that_an_engine_does_not_serve_is_refused() -> None:
    with servers(config("vllm", "prefill"), config("vllm", "decode")) as (p, d), \
            pytest.raises(PreflightError) as err:
        preflight("vllm", [p.url], [d.url], "br-emulated", "auto")
    msg = str(err.value)
    assert "remote.model: 'br-emulated' is not served by" in msg, msg
    assert f"{p.url} serves ['emulated']" in msg, msg


def test_pick_model_with_several_shared_models_asks_for_one() -> None:
    with pytest.raises(PreflightError, match="several models"):
        pick_model([("a", ("m", "n")), ("b", ("n", "m"))], None)
    assert pick_model([("a", ("m", "lora1")), ("b", ("m",))], None) == "m"


def test_an_unreachable_engine_fails_fast_naming_it() -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    with servers(config("vllm", "prefill")) as (p,):
        t0 = time.monotonic()
        with pytest.raises(PreflightError) as err:
            preflight("vllm", [p.url], [closed], None, "auto", timeout_s=2.0)
        took = time.monotonic() - t0
    assert f"remote.decode_urls[0] {closed}: cannot reach the engine" in str(err.value)
    assert took < 10, took


def test_params_mode_refuses_a_prompt_keyed_prefill(tmp_path: Path) -> None:
    with servers(config("vllm", "prefill", kv_store_dir=str(tmp_path)),
                 config("vllm", "decode", kv_store_dir=str(tmp_path))) as (p, d):
        with pytest.raises(PreflightError) as err:
            preflight("vllm", [p.url], [d.url], None, "params")
        assert preflight("vllm", [p.url], [d.url], None, "prompt").kv_handoff == "prompt"
    msg = str(err.value)
    assert f"remote.prefill_urls[0] {p.url}: the prefill answer has no kv_transfer_params" \
        in msg, msg
    assert "remote.kv_handoff=prompt or auto" in msg, msg


def test_prompt_mode_refuses_a_prefill_that_returns_params() -> None:
    with servers(config("vllm", "prefill"), config("vllm", "decode")) as (p, d):
        with pytest.raises(PreflightError, match=r"remote\.kv_handoff is 'prompt'"):
            preflight("vllm", [p.url], [d.url], None, "prompt")
        assert preflight("vllm", [p.url], [d.url], None, "params").kv_handoff == "params"
        # the probe's KV hold was released on the prefill emulator
        kv = httpx.get(p.url + "/emulator/stats", timeout=10).json()["kv"]
    assert kv.get("held", 0) == 0, kv


async def _decode(client: RemoteEngineClient, url: str, ticket: RemoteTicket) -> list[str]:
    body, headers = ticket.decode_call(ticket.request_id + "-d", None)
    texts = []
    async for ev in client.stream(url + endpoint_path(False), body, headers):
        if isinstance(ev, TokenChunk):
            texts.append(ev.text)
    return texts


def test_prompt_keyed_handoff_end_to_end(tmp_path: Path) -> None:
    """A prefill answer without parameters makes a ticket whose decode call is the same
    prompt with none; the decode emulator finds the stored KV (no recompute)."""
    store = str(tmp_path)
    body = {"model": "emulated", "prompt": "a b c d", "max_tokens": 5, "seed": 3,
            "temperature": 0.0}

    async def run(p: str, d: str) -> tuple[list[str], list[str], str]:
        async with RemoteEngineClient() as c:
            with pytest.raises(EngineProtocolError, match=r"remote\.kv_handoff=prompt"):
                await c.vllm_prefill(p, body, "r0", kv_handoff="params")
            pre = await c.vllm_prefill(p, body, "r1", kv_handoff="auto")
            assert pre.kv_transfer_params is None
            t = RemoteTicket("vllm", p, "r1", body, pre.prompt_tokens)
            assert t.prompt_keyed
            dbody, _ = t.decode_call("x", None)
            assert "kv_transfer_params" not in dbody and dbody["prompt"] == "a b c d"
            texts = await _decode(c, d, t)
            other = dict(body, prompt="never prefilled")  # a miss: computed, still served
            miss = await _decode(c, d, RemoteTicket("vllm", p, "r2", other, 2))
            return texts, miss, pre.text

    with servers(config("vllm", "prefill", kv_store_dir=store),
                 config("vllm", "decode", kv_store_dir=store)) as (p, d):
        texts, miss, first = asyncio.run(run(p.url, d.url))
        stats = httpx.get(d.url + "/emulator/stats", timeout=10).json()
    assert texts == expected_texts("a b c d", 5, seed=3)
    assert first == texts[0]
    assert len(miss) == 5
    assert stats["ranks"][0]["kv_pulls"] == 1 and stats["ranks"][0]["kv_recomputes"] == 1
    assert len(os.listdir(store)) == 1  # the first prefill's (r0 also stored the same key)


def test_decode_request_without_params_only_for_prompt_keyed() -> None:
    """Without transfer parameters the decode request carries none; a decode server with no
    shared store then prefills the prompt itself, as a real vLLM kv_consumer does (the
    conformance table in docs/engine-contracts.md): served, not refused."""
    body, _ = vllm_decode_request({"model": "emulated", "prompt": "x",
                                   "kv_transfer_params": {}, "max_tokens": 3}, None, "r")
    assert "kv_transfer_params" not in body and body["stream"] is True
    with servers(config("vllm", "decode")) as (d,):
        r = httpx.post(d.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert r.text.rstrip().endswith("data: [DONE]"), r.text


def test_emulator_kv_store_dir_is_validated(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--kv-store-dir"):
        config("sglang", "prefill", kv_store_dir=str(tmp_path))
    with pytest.raises(ValueError, match="is not a directory"):
        config("vllm", "prefill", kv_store_dir=str(tmp_path / "nope"))

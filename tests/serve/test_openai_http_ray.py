"""The OpenAI surface over real HTTP against a deployed graph (one local Ray cluster).

Three applications on one port: ``balance_route`` (G=2, route ``/``, a 64-token context
to test its limit) and ``br_fresh`` (G=1, route ``/fresh``), deployed *without* the
readiness call that ``deploy`` makes, so its first request is the first thing that
ever runs in its ingress (what ``serve run`` gives a user): the disconnect test needs
that; and ``br_ready`` (G=2, route ``/readyapp``), whose first contact right after
Serve reported it ready is recorded for the readiness test.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.serve.helpers import expected_texts, free_port, start_ray, stream_completion

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(300)]

MODEL = "br-emulated"


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    import ray
    from ray import serve

    from br_serve.serve.config import parse_graph_config
    from br_serve.serve.graph import build, deploy

    start_ray()
    p = free_port()
    deploy(parse_graph_config(replicas=2, prefill_replicas=1, serve_port=p, step_b_s=0.01,
                              serve_max_context_tokens=64, serve_barrier_timeout_s=5))
    serve.run(build(parse_graph_config(serve_app_name="br_fresh", replicas=1, prefill_replicas=1,
                                       step_b_s=0.02, serve_barrier_timeout_s=5)),
              name="br_fresh", route_prefix="/fresh", blocking=False)
    # As `serve run` does: serve.run returns when Serve calls the app ready (the
    # ingress's constructor returned); what a user sees right then is recorded here.
    serve.run(build(parse_graph_config(serve_app_name="br_ready", replicas=2, prefill_replicas=1,
                                       step_b_s=0.01, serve_barrier_timeout_s=5)),
              name="br_ready", route_prefix="/readyapp", blocking=False)
    _AT_READY.update(_first_contact(f"http://127.0.0.1:{p}/readyapp"))
    yield p
    serve.shutdown()  # type: ignore[no-untyped-call]
    ray.shutdown()


_AT_READY: dict[str, Any] = {}


def _first_contact(base: str) -> dict[str, Any]:
    """/health, /ready and the first streamed token, right after the app is ready."""
    with httpx.Client(base_url=base, timeout=60) as c:
        health, ready = c.get("/health").status_code, c.get("/ready").status_code
        t0 = time.perf_counter()
        first_token_s = None
        with c.stream("POST", "/v1/completions", json={
                "model": MODEL, "prompt": "a b", "max_tokens": 20, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and '"text"' in line and first_token_s is None:
                    first_token_s = time.perf_counter() - t0
        return {"health": health, "ready": ready, "first_token_s": first_token_s,
                "status": r.status_code}


@pytest.fixture()
def client(port: int) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
        yield c


def _stream(port: int, payload: dict[str, Any], path: str = "/v1/completions") -> Any:
    async def run() -> Any:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
            return await stream_completion(c, path, payload)

    return asyncio.run(run())


def _running(client: httpx.Client) -> int:
    return sum(r["running"] for r in client.get("/v1/br/state").json()["replicas"])


# -- refusals over HTTP -------------------------------------------------------------------
@pytest.mark.parametrize(("extra", "param"), [
    ({"max_tokens": "8"}, "max_tokens"),
    ({"prompt": [5, -1]}, "prompt"),
    ({"logprobs": 2}, "logprobs"),
    ({"n": 2}, "n"),
    ({"best_of": 2}, "best_of"),
    ({"frobnicate": True}, "frobnicate"),
    ({"prompt": [40000]}, "prompt"),  # outside the emulated engine's 32000-id vocabulary
])
def test_bad_fields_get_400_naming_them(client: httpx.Client, extra: dict[str, Any],
                                        param: str) -> None:
    for stream in (False, True):
        r = client.post("/v1/completions", json={"model": MODEL, "prompt": "a b",
                                                 "stream": stream, **extra})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and err["message"].startswith(param), err
        assert err["type"] == "invalid_request_error"
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "a", "stream": "yes"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream"


def test_over_context_is_400_with_maximum_context_length(client: httpx.Client) -> None:
    for prompt, max_tokens in ((" ".join(["w"] * 70), 4), (" ".join(["w"] * 60), 10)):
        r = client.post("/v1/completions", json={"model": MODEL, "prompt": prompt,
                                                 "max_tokens": max_tokens})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert "maximum context length is 64 tokens" in err["message"]
        assert err["param"] == "prompt"


def test_non_json_bodies_wrong_methods_and_routes_get_openai_errors(
        client: httpx.Client) -> None:
    body = b'{"model": "br-emulated", "prompt": "a"}'
    for headers in ({"content-type": "text/plain"}, {}):
        r = client.post("/v1/completions", content=body, headers=headers)
        assert r.status_code == 400 and "application/json" in r.json()["error"]["message"]
    r = client.get("/v1/completions")
    assert r.status_code == 405 and "POST" in r.headers.get("allow", "")
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    for method, path in (("POST", "/v1/nope"), ("GET", "/nope")):
        r = client.request(method, path)
        assert r.status_code == 404, r.text
        assert r.json()["error"]["code"] == "not_found" and "detail" not in r.json()
    assert client.get("/health").status_code == 200  # still serving


# -- honoured fields -----------------------------------------------------------------------
def test_stop_string_across_a_token_boundary_streamed_and_not(
        client: httpx.Client, port: int) -> None:
    toks = expected_texts(21, 2, 20)  # " t<id>" words
    full = "".join(toks)
    # a stop string made of the end of token k-1 and the start of token k, for the first
    # k where that is its first occurrence in the text
    k, stop = next((k, toks[k - 1][-2:] + toks[k][:3]) for k in range(3, 19)
                   if full.find(toks[k - 1][-2:] + toks[k][:3]) == len("".join(toks[:k])) - 2)
    base = {"model": MODEL, "prompt": "x y", "max_tokens": 20, "seed": 21, "stop": [stop]}
    r = client.post("/v1/completions", json=base)
    assert r.status_code == 200
    ch = r.json()["choices"][0]
    assert ch["text"] == full[: full.find(stop)]
    assert (ch["finish_reason"], ch["stop_reason"]) == ("stop", stop)
    assert r.json()["usage"]["completion_tokens"] == k + 1  # up to the token completing it
    s = _stream(port, base)
    assert s.done and "".join(s.texts) == ch["text"] and s.finish_reason == "stop"
    inc = client.post("/v1/completions", json={**base, "include_stop_str_in_output": True})
    assert inc.json()["choices"][0]["text"] == full[: full.find(stop) + len(stop)]
    # chat: the template "user: x\nassistant:" is 3 words; a stop inside token 4
    ctoks = expected_texts(21, 3, 20)
    cfull, cstop = "".join(ctoks), ctoks[4][2:5]
    cbody = {"model": MODEL, "max_tokens": 20, "seed": 21, "stop": cstop,
             "messages": [{"role": "user", "content": "x"}]}
    chat = client.post("/v1/chat/completions", json=cbody).json()["choices"][0]
    assert chat["message"]["content"] == cfull[: cfull.find(cstop)]
    assert chat["finish_reason"] == "stop"
    cs = _stream(port, cbody, "/v1/chat/completions")
    assert "".join(cs.texts) == chat["message"]["content"] and cs.finish_reason == "stop"
    # the decode slots of the stopped requests come back (the ingress aborts them)
    deadline = time.monotonic() + 20
    while _running(client) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _running(client) == 0


def test_stop_token_ids_echo_request_id_and_usage_options(client: httpx.Client,
                                                          port: int) -> None:
    from br_serve.engine.emulated import token_id

    ids = [token_id(5, 3 + i) for i in range(10)]
    k = 4
    r = client.post("/v1/completions", json={
        "model": MODEL, "prompt": "p q r", "max_tokens": 10, "seed": 5,
        "stop_token_ids": [ids[k]], "echo": True, "request_id": "abc"})
    body = r.json()
    assert body["id"] == "cmpl-abc"
    first = ids.index(ids[k])
    assert body["choices"][0]["text"] == "p q r" + "".join(expected_texts(5, 3, first))
    assert body["choices"][0]["stop_reason"] == ids[k]
    s = _stream(port, {"model": MODEL, "prompt": "p q r", "max_tokens": 6, "seed": 5,
                       "echo": True, "stream_options": {}})
    assert "".join(s.texts) == "p q r" + "".join(expected_texts(5, 3, 6))
    assert s.usage == {"prompt_tokens": 3, "completion_tokens": 6, "total_tokens": 9}


def test_openai_client_stop(port: int) -> None:
    import openai

    oc = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
    full = "".join(expected_texts(3, 2, 12))
    stop = expected_texts(3, 2, 12)[2].strip()
    c = oc.completions.create(model=MODEL, prompt="a b", max_tokens=12, seed=3, stop=[stop])
    assert c.choices[0].text == full[: full.find(stop)]
    assert c.choices[0].finish_reason == "stop"


# -- client disconnects (issue 12, item 8) ---------------------------------------------------
#: traceback frames of the ingress's long-lived I/O tasks (serve/frontend/events.py, channel.py)
_OUR_IO_FRAMES = ("in _poll_loop", "in _watch_scheduler", "in _lost", "in _open_channel",
                  "in _serve")


def _ingress_log_lines(app: str) -> list[str]:
    import ray

    node: Any = ray._private.worker._global_node
    logs = Path(node.get_session_dir_path()) / "logs"
    lines: list[str] = []
    for f in logs.glob("worker-*"):
        text = f.read_text(errors="replace")
        if f":actor_name:ServeReplica:{app}:Ingress" in text[:500]:
            lines.extend(text.splitlines())
    return lines


def test_first_request_disconnect_keeps_the_app_serving_and_quiet(port: int) -> None:
    """The first request an ingress ever serves starts its poll loops; its client going
    away must cancel only that request, not the loops (which took every replica for
    dead: ~15 lines of TaskCancelledError per replica, then 503 for everyone)."""
    base = f"http://127.0.0.1:{port}/fresh"

    async def cut() -> int:
        body = {"model": MODEL, "prompt": "a b", "max_tokens": 400, "stream": True}
        async with httpx.AsyncClient(base_url=base, timeout=60) as c, \
                c.stream("POST", "/v1/completions", json=body) as r:
            n = 0
            async for line in r.aiter_lines():
                n += line.startswith("data: ")
                if n >= 3:
                    break
            return r.status_code

    deadline = time.monotonic() + 60
    while httpx.get(f"{base}/health").status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert asyncio.run(cut()) == 200
    time.sleep(3)  # let cancellation and any fallout play out
    r = httpx.post(f"{base}/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": "c d", "max_tokens": 5, "seed": 4})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == "".join(expected_texts(4, 2, 5))
    lines = _ingress_log_lines("br_fresh")
    assert [ln for ln in lines if "lost decode replica" in ln] == []
    # a cancellation in our background I/O (poll loops, scheduler watch) is the bug;
    # Serve's own request task may log the cancellation of the request it served
    ours = [i for i, ln in enumerate(lines) if "CancelledError" in ln and any(
        f in ctx for ctx in lines[max(0, i - 40):i + 1] for f in _OUR_IO_FRAMES)]
    assert ours == [], [lines[i] for i in ours[:5]]


def test_ready_means_a_request_is_served_now(port: int) -> None:
    """Liveness and readiness are distinct endpoints, and readiness (what `serve run`
    waits for) means a request is served at once: the first request right after it
    gets its first token within seconds (the graph used to report ready 5-9 s before
    a completion could run, and had no readiness endpoint: /ready was a 404)."""
    assert _AT_READY["health"] == 200 and _AT_READY["ready"] == 200, _AT_READY
    assert _AT_READY["status"] == 200 and _AT_READY["first_token_s"] is not None
    assert _AT_READY["first_token_s"] < 3.0, _AT_READY

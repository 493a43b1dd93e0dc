"""The deployed graph over HTTP, the openai client and the handle API (real Ray Serve).

One local Ray cluster for the module, two applications on one HTTP port:
``balance_route`` (G=3, route ``/``) and ``br_small`` (G=1, one slot, pool of one,
API key; route ``/small``). Destructive tests (scheduler and replica kills) run last.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.serve.helpers import expected_texts, free_port, start_ray, stream_completion

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(240)]

MODEL = "br-emulated"
KEY = "sekret"
METRICS_PORT = 0  # picked when the module's cluster starts (a port picked at collection
# could be bound by anything in the minutes before it is used)
STEP_B_S = 0.02
FACTOR = (1.0, 1.0, 2.0)


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    import ray
    from ray import serve

    from br_serve.serve.config import parse_graph_config
    from br_serve.serve.graph import deploy

    global METRICS_PORT
    METRICS_PORT = free_port()
    start_ray(metrics_port=METRICS_PORT)
    p = free_port()
    # replica 2's engine steps twice as long as the configured model says, and the
    # policy routes on step time calibrated online (test_state_endpoint,
    # test_calibration_finds_the_slow_replica)
    deploy(parse_graph_config(replicas=3, prefill_replicas=2, serve_port=p, step_b_s=STEP_B_S,
                              engine_step_factor=FACTOR, policy_options={"cost": "time"},
                              serve_max_context_tokens=2048, serve_barrier_timeout_s=5))
    deploy(parse_graph_config(serve_app_name="br_small", replicas=1, prefill_replicas=1, slots=1,
                              pool_capacity=1, serve_api_key=KEY, serve_port=p, step_b_s=0.05),
           route_prefix="/small")
    yield p
    serve.shutdown()  # type: ignore[no-untyped-call]
    ray.shutdown()


@pytest.fixture()
def client(port: int) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
        yield c


def words(n: int) -> str:
    return " ".join(["w"] * n)


async def _many(port: int, n: int, max_tokens: int, prompt_len: int = 5,
                path: str = "/v1/completions") -> list[Any]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as c:
        return await asyncio.gather(*(
            stream_completion(c, path, {"model": MODEL, "prompt": words(prompt_len + i % 7),
                                        "max_tokens": max_tokens, "seed": 1000 + i})
            for i in range(n)))


def _check_exact(results: list[Any], max_tokens: int, prompt_len: int = 5) -> None:
    for i, r in enumerate(results):
        assert r.status == 200, r.body
        assert r.error is None, r.error
        assert r.done and r.finish_reason == "length"
        assert r.texts == expected_texts(1000 + i, prompt_len + i % 7, max_tokens), i
        assert r.usage and r.usage["completion_tokens"] == max_tokens


# -- happy paths -----------------------------------------------------------------------
def test_streamed_token_count_equals_max_tokens(port: int) -> None:
    async def run() -> Any:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
            return await stream_completion(c, "/v1/completions", {
                "model": MODEL, "prompt": "a b c d", "max_tokens": 13, "seed": 7,
                "stream_options": {"include_usage": True}})

    r = asyncio.run(run())
    assert r.status == 200 and r.done and r.error is None
    assert r.texts == expected_texts(7, 4, 13)
    assert r.usage == {"prompt_tokens": 4, "completion_tokens": 13, "total_tokens": 17}


def test_non_streaming_completion_and_chat(client: httpx.Client) -> None:
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "x y", "max_tokens": 4,
                                             "seed": 3})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == "".join(expected_texts(3, 2, 4))
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}
    r = client.post("/v1/chat/completions", json={
        "model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] == 3
    assert len(body["choices"][0]["message"]["content"].split()) == 3


def test_max_tokens_one_never_reaches_decode(client: httpx.Client) -> None:
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "p q r", "max_tokens": 1,
                                             "seed": 9})
    assert r.status_code == 200
    assert r.json()["choices"][0]["text"] == expected_texts(9, 3, 1)[0]


def test_openai_client_works_unchanged(port: int) -> None:
    import openai

    oc = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
    assert [m.id for m in oc.models.list()] == [MODEL]
    c = oc.completions.create(model=MODEL, prompt="one two three", max_tokens=6, seed=11)
    assert c.choices[0].text == "".join(expected_texts(11, 3, 6))
    assert c.usage is not None and c.usage.completion_tokens == 6
    pieces = [ch.choices[0].text for ch in oc.completions.create(
        model=MODEL, prompt="one two three", max_tokens=6, seed=11, stream=True)
        if ch.choices]
    assert pieces == expected_texts(11, 3, 6)
    chat = oc.chat.completions.create(model=MODEL, max_tokens=5, seed=2,
                                      messages=[{"role": "user", "content": "hello"}])
    assert chat.choices[0].message.content is not None
    assert len(chat.choices[0].message.content.split()) == 5
    stream = oc.chat.completions.create(model=MODEL, max_tokens=5, seed=2, stream=True,
                                        messages=[{"role": "user", "content": "hello"}],
                                        stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == chat.choices[0].message.content  # same seed, same prompt
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5


def test_handle_api_streams_tokens(port: int) -> None:
    from ray import serve

    handle = serve.get_app_handle("balance_route").options(stream=True)
    gen: Any = handle.generate_stream.remote("a b c", max_tokens=8, seed=5)
    toks = list(gen)
    assert [t["index"] for t in toks] == list(range(8))
    assert [t["text"] for t in toks] == expected_texts(5, 3, 8)
    assert toks[-1]["finished"] and toks[-1]["finish_reason"] == "length"
    from br_serve.serve.graph import get_handle

    # two graphs run in this module: by name it works, without one it says which
    h = get_handle("balance_route").options(stream=True)
    assert len(list(h.generate_stream.remote("a b", max_tokens=3, seed=1))) == 3
    with pytest.raises(LookupError, match="several"):
        get_handle()


def test_state_endpoint(client: httpx.Client) -> None:
    s = client.get("/v1/br/state").json()
    assert s["policy"] == "br0" and len(s["replicas"]) == 3
    assert {"load_tokens", "running", "free_slots", "alive"} <= set(s["replicas"][0])
    assert "pool_size" in s and "recent_mean_imbalance_tokens" in s
    assert s["members"] == [0, 1, 2] and s["generation"] >= 1
    assert s["step_coefficients"] == "calibrated"  # cost=time: fitted online
    assert {"a_s_per_token", "b_s", "c_s_per_request", "residual_scale_s", "steps",
            "calibrated"} <= set(s["replicas"][0]["step"])


def test_100_concurrent_requests_all_finish(port: int) -> None:
    results = asyncio.run(_many(port, 100, 20))
    _check_exact(results, 20)


def client_port(client: httpx.Client) -> int:
    port = client.base_url.port
    assert port is not None
    return port


def _channel_stats(app: str, replicas: int) -> list[dict[str, float]]:
    import ray

    return ray.get([ray.get_actor(f"{app}:decode:{g}", namespace="br_serve")
                    .proc_stats.remote() for g in range(replicas)])


def test_events_and_reports_travel_over_the_channels(port: int) -> None:
    """With the default ``event_channel=tcp`` no replica is left on the polling path:
    each writes the ingress's events and its reports to the channels."""
    asyncio.run(_many(port, 6, 5))
    stats = _channel_stats("balance_route", 3)
    assert all(s["channels_open"] == 1 and s["reports_open"] == 1 for s in stats), stats
    # what each report path carried since the scheduler started (printed for docs)
    paths = httpx.get(f"http://127.0.0.1:{port}/v1/br/state").json()["reports_by_path"]
    print(f"REPORT-PATHS steady {paths}")
    assert paths["channel"] > paths["ray"], paths


def test_calibration_finds_the_slow_replica(client: httpx.Client) -> None:
    """After the traffic above, each replica's fit prices a typical step near its
    engine's time (measured compute: the modelled sleep plus this busy host's wake-up
    delay), although the scheduler was told all three are alike: replica 2 comes out
    slower than the others by about its factor of 2.

    A replica's fit counts only steps in which it ran something, and ``cost=time``
    sends the slow replica less once it is seen to be slow, so the traffic above can
    leave it short of the 20 steps that make a fit count (CI saw this once on a busy
    host). More traffic is sent, a bounded number of rounds, until every fit counts."""
    fits: list[dict[str, Any]] = []
    for _ in range(8):
        fits = [r["step"] for r in client.get("/v1/br/state").json()["replicas"]]
        if all(f["steps"] >= 20 and f["calibrated"] for f in fits):
            break
        asyncio.run(_many(client_port(client), 12, 20))
    assert all(f["steps"] >= 20 and f["calibrated"] for f in fits), fits
    t = [f["a_s_per_token"] * 100 + f["c_s_per_request"] * 4 + f["b_s"] for f in fits]
    assert STEP_B_S * 2 * 0.9 < t[2] < STEP_B_S * 2 * 2.5, t
    assert t[2] > 1.3 * t[0] and t[2] > 1.3 * t[1], t


def test_prometheus_metrics_are_exported(port: int) -> None:
    """Every metric the graph records reaches Ray's Prometheus endpoint, after traffic
    (the 100-request test above ran; one more request makes sure of it)."""
    asyncio.run(_many(port, 4, 6))
    want = ["ray_br_pool_size", "ray_br_imbalance_tokens_bucket",
            "ray_br_tick_latency_ms_bucket", "ray_br_ttft_ms_bucket", "ray_br_tpot_ms_bucket",
            'ray_br_replica_load_tokens{', 'ray_br_replica_running{',
            'ray_br_step_coef_a_s_per_token{', 'ray_br_step_coef_b_s{',
            'ray_br_step_coef_c_s_per_request{', 'ray_br_step_residual_scale_s{']
    def ttft_count(text: str) -> float:
        counts = [ln for ln in text.splitlines() if ln.startswith("ray_br_ttft_ms_count")]
        return sum(float(ln.rsplit(" ", 1)[1]) for ln in counts)

    text, missing = "", want
    # Ray flushes metrics every few seconds, and a flush may carry only part of the
    # histogram counts recorded so far: wait for the names and for the 4 TTFTs above.
    deadline = time.monotonic() + 90
    while (missing or ttft_count(text) < 4) and time.monotonic() < deadline:
        try:
            text = httpx.get(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=10).text
        except httpx.HTTPError:
            text = ""
        missing = [w for w in want if w not in text]
        if missing or ttft_count(text) < 4:
            time.sleep(2)
    assert not missing, f"not exported: {missing}"
    loads = [ln for ln in text.splitlines() if ln.startswith("ray_br_replica_load_tokens{")]
    assert {f'replica="{g}"' in " ".join(loads) for g in range(3)} == {True}
    assert ttft_count(text) >= 4, text


# -- errors -----------------------------------------------------------------------------
@pytest.mark.parametrize(("payload", "status", "param"), [
    ({"prompt": "a", "max_tokens": 0}, 400, "max_tokens"),
    ({"max_tokens": 3}, 400, "prompt"),
    ({"prompt": "a", "temperature": "hot"}, 400, "temperature"),
    ({"prompt": "a", "n": 2}, 400, "n"),
    ({"prompt": ""}, 400, None),
    ({"prompt": "a", "model": "gpt-9"}, 404, "model"),
    ({"prompt": words(2100), "max_tokens": 4}, 400, "prompt"),
    ({"prompt": words(2040), "max_tokens": 100}, 400, "prompt"),
])
def test_bad_inputs_get_their_status(client: httpx.Client, payload: dict[str, Any],
                                     status: int, param: str | None) -> None:
    body = {"model": MODEL, **payload}
    for stream in (False, True):
        r = client.post("/v1/completions", json={**body, "stream": stream})
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert err["message"] and err["type"]
        if param:
            assert err["param"] == param or err["message"].startswith(param)


def test_bad_json_and_non_object(client: httpx.Client) -> None:
    r = client.post("/v1/completions", content=b"{not json",
                    headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = client.post("/v1/chat/completions", json=[1, 2])
    assert r.status_code == 400
    r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


def test_api_key_guards_everything_but_health(client: httpx.Client) -> None:
    assert client.get("/small/health").status_code == 200
    for method, path in (("GET", "/small/v1/models"), ("GET", "/small/v1/br/state"),
                         ("POST", "/small/v1/completions")):
        r = client.request(method, path, json={"model": MODEL, "prompt": "a"})
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "invalid_api_key"
        r = client.request(method, path, json={"model": MODEL, "prompt": "a"},
                           headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
    r = client.get("/small/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200


def test_full_pool_answers_429(port: int) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}

    async def run() -> list[Any]:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
            return await asyncio.gather(*(
                stream_completion(c, "/small/v1/completions",
                                  {"model": MODEL, "prompt": "a b", "max_tokens": 30}, auth)
                for _ in range(5)))

    res = asyncio.run(run())
    codes = sorted(r.status for r in res)
    # one slot + a pool of one: at most two (plus one in flight) can be accepted
    assert codes.count(429) >= 2, codes
    assert set(codes) <= {200, 429}
    for r in res:
        if r.status == 429:
            assert r.body["error"]["type"] == "rate_limit_exceeded"
        else:
            assert len(r.texts) == 30 and r.error is None


def test_no_alive_decode_replica_answers_503(client: httpx.Client) -> None:
    import ray

    ray.kill(ray.get_actor("br_small:decode:0", namespace="br_serve"), no_restart=True)
    auth = {"Authorization": f"Bearer {KEY}"}
    deadline = time.monotonic() + 30
    status = 0
    while time.monotonic() < deadline:
        r = client.post("/small/v1/completions", headers=auth,
                        json={"model": MODEL, "prompt": "a", "max_tokens": 3})
        status = r.status_code
        if status == 503:
            assert r.json()["error"]["type"] == "service_unavailable"
            break
        time.sleep(0.5)
    assert status == 503


# -- faults (last: they change the cluster) ----------------------------------------------
def test_scheduler_restart_loses_no_pool_request(port: int, client: httpx.Client) -> None:
    import ray

    before = client.get("/v1/br/state").json()["incarnation"]

    async def run() -> list[Any]:
        task = asyncio.ensure_future(_many(port, 90, 80))
        for _ in range(600):  # kill once the pool holds requests
            await asyncio.sleep(0.05)
            st = httpx.get(f"http://127.0.0.1:{port}/v1/br/state").json()
            if st["pool_size"] >= 5:
                break
        assert st["pool_size"] >= 5, st
        ray.kill(ray.get_actor("balance_route:scheduler", namespace="br_serve"),
                 no_restart=False)
        return await task

    results = asyncio.run(run())
    _check_exact(results, 80)
    after = client.get("/v1/br/state").json()
    assert after["incarnation"] != before
    assert after["pool_size"] == 0
    print(f"REPORT-PATHS after-scheduler-restart {after['reports_by_path']}")
    # the new scheduler adopted the group and announced its own report channel
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not all(
            s["reports_open"] == 1 for s in _channel_stats("balance_route", 3)):
        time.sleep(0.2)
    assert all(s["reports_open"] == 1 for s in _channel_stats("balance_route", 3))


def test_killing_a_decode_replica_ends_no_other_stream(port: int, client: httpx.Client) -> None:
    """...and the replica is replaced by a new actor that joins the barrier (before:
    the group re-formed without it, and its capacity was gone until a redeploy)."""
    import ray

    before = client.get("/v1/br/state").json()

    async def run() -> list[Any]:
        task = asyncio.ensure_future(_many(port, 24, 120))
        for _ in range(200):
            await asyncio.sleep(0.05)
            st = httpx.get(f"http://127.0.0.1:{port}/v1/br/state").json()
            if st["replicas"][1]["running"] >= 3:
                break
        assert st["replicas"][1]["running"] >= 3, st
        await asyncio.sleep(0.3)  # let streams produce some tokens first
        ray.kill(ray.get_actor("balance_route:decode:1", namespace="br_serve"),
                 no_restart=True)
        return await asyncio.wait_for(task, 120)  # no stream may hang

    results = asyncio.run(run())
    complete = 0
    for i, r in enumerate(results):
        assert r.status == 200 and r.done
        exp = expected_texts(1000 + i, 5 + i % 7, 120)
        if r.error is None:
            assert r.texts == exp, i  # no duplicated or missing token across re-prefill
            complete += 1
        else:  # an explicit error event, after a correct prefix
            assert r.texts == exp[: len(r.texts)]
    assert complete == len(results), [r.error for r in results if r.error]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        st = client.get("/v1/br/state").json()
        if st["members"] == [0, 1, 2] and st["replicas"][1]["alive"]:
            break
        time.sleep(0.5)
    assert st["members"] == [0, 1, 2] and st["replicas"][1]["alive"], st
    assert st["generation"] > before["generation"]
    # the whole group serves again, the new replica included
    results = asyncio.run(_many(port, 12, 6))
    _check_exact(results, 6)
    paths = client.get("/v1/br/state").json()["reports_by_path"]
    print(f"REPORT-PATHS after-replica-replaced {paths}")

"""Checks of the remote engines before the graph deploys (blocking, bounded).

:func:`preflight` runs in the graph's builder, so a deployment that could never serve
fails at once with a message naming the cause, instead of a warm-up that retries:

1. every prefill and decode URL answers ``GET /health`` (bounded by ``timeout_s``);
2. the model: every URL's ``GET /v1/models`` (SGLang without it: ``/model_info``); with
   no model given, the one model every engine serves is used; engines that serve
   different models are refused, naming the URLs and what each serves; a model given
   must be served by each;
3. vLLM with ``kv_handoff`` ``params`` or ``prompt``: one probe prefill
   (``max_tokens: 1``) on each prefill URL, whose answer must fit (``params``:
   ``kv_transfer_params`` present; ``prompt``: none); a probe that left KV held is
   released (``cancel``; 404 is fine). ``auto`` takes either answer: no probe.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from br_serve.remote.requests import bearer, check_vllm_kv_params, vllm_prefill_request

#: the prompt of the probe prefill
PROBE_PROMPT = "warm up"


class PreflightError(RuntimeError):
    """A remote engine cannot serve the graph (the message names the URL and cause)."""


@dataclass(frozen=True, slots=True)
class Preflight:
    """What the engines were found to serve. ``kv_handoff``: what the probe prefill
    answered (``params`` / ``prompt``), or ``auto`` when no probe ran."""

    model: str
    kv_handoff: str


def _named(field: str, urls: Sequence[str]) -> list[tuple[str, str]]:
    return [(f"{field}[{i}] {url}", url) for i, url in enumerate(urls)]


def _get(http: Any, name: str, url: str) -> Any:
    import httpx

    try:
        return http.get(url)
    except httpx.HTTPError as exc:
        raise PreflightError(f"{name}: cannot reach the engine "
                             f"({type(exc).__name__}: {exc})") from None


def served_models(http: Any, name: str, url: str, protocol: str) -> tuple[str, ...]:
    """The model names the engine at ``url`` serves (``name`` labels errors)."""
    r = _get(http, name, f"{url}/v1/models")
    if r.status_code == 200:
        try:
            ids = tuple(str(m["id"]) for m in r.json()["data"])
        except (ValueError, KeyError, TypeError) as exc:
            raise PreflightError(f"{name}: /v1/models answered no model list "
                                 f"({exc!r}: {r.text[:120]!r})") from None
        if ids:
            return ids
    if protocol == "sglang":
        r2 = _get(http, name, f"{url}/model_info")
        if r2.status_code == 200:
            info = r2.json()
            got = info.get("served_model_name") or info.get("model_path")
            if got:
                return (str(got),)
    raise PreflightError(f"{name}: cannot tell which model it serves (/v1/models "
                         f"answered {r.status_code} {r.text[:120]!r})")


def pick_model(served: Sequence[tuple[str, tuple[str, ...]]], model: str | None) -> str:
    """The model to send: ``model`` if every engine serves it, else the one model they
    all serve. ``served``: ``(name of the URL, its models)``.

    Raises:
        PreflightError: naming the URLs and what each serves.
    """
    listing = "; ".join(f"{name} serves {list(ms)}" for name, ms in served)
    if model is not None:
        missing = [name for name, ms in served if model not in ms]
        if missing:
            raise PreflightError(f"remote.model: {model!r} is not served by "
                                 f"{', '.join(missing)} ({listing})")
        return model
    common = set(served[0][1])
    for _, ms in served[1:]:
        common &= set(ms)
    if len(common) == 1:
        return common.pop()
    if not common:
        raise PreflightError(f"remote engines serve different models ({listing}); start "
                             "them with the same model")
    raise PreflightError(f"remote.model: the engines serve several models "
                         f"{sorted(common)}; name one")


def probe_vllm_prefill(http: Any, name: str, url: str, model: str,
                       kv_handoff: str, request_id: str) -> str:
    """One prefill on the vLLM server at ``url``; returns ``params`` or ``prompt``
    (what its answer carried), checked against ``kv_handoff``."""
    import httpx

    body, headers = vllm_prefill_request(
        {"model": model, "prompt": PROBE_PROMPT, "temperature": 0.0}, request_id)
    try:
        r = http.post(f"{url}/v1/completions", json=body, headers=headers)
    except httpx.TimeoutException:
        raise PreflightError(f"{name}: the probe prefill got no answer within "
                             f"{http.timeout.read:g} s") from None
    except httpx.HTTPError as exc:
        raise PreflightError(f"{name}: the probe prefill failed "
                             f"({type(exc).__name__}: {exc})") from None
    if r.status_code != 200:
        raise PreflightError(f"{name}: the probe prefill answered {r.status_code} "
                             f"{r.text[:300]!r}")
    try:
        raw = r.json().get("kv_transfer_params")
    except (ValueError, AttributeError):
        raise PreflightError(f"{name}: the probe prefill's answer is not a JSON object "
                             f"({r.text[:120]!r})") from None
    if raw is None:
        if kv_handoff == "params":
            raise PreflightError(
                f"{name}: the prefill answer has no kv_transfer_params, and "
                "remote.kv_handoff is 'params' (start the prefill server with a kv_producer "
                "--kv-transfer-config whose connector returns them, e.g. NixlConnector; a "
                "prompt-keyed connector such as ExampleConnector or LMCache needs "
                "remote.kv_handoff=prompt or auto)")
        return "prompt"
    try:
        check_vllm_kv_params(raw)
    except ValueError as exc:
        raise PreflightError(f"{name}: {exc}") from None
    # the probe's KV is held until a decode pulls it: free it (404: nothing held)
    with contextlib.suppress(httpx.HTTPError):
        http.post(f"{url}/v1/requests/{request_id}/cancel")
    if kv_handoff == "prompt":
        raise PreflightError(f"{name}: the prefill answer carries kv_transfer_params, and "
                             "remote.kv_handoff is 'prompt' (set it to 'params' or 'auto')")
    return "params"


def preflight(protocol: str, prefill_urls: Sequence[str], decode_urls: Sequence[str],
              model: str | None, kv_handoff: str, api_key: str | None = None,
              timeout_s: float = 6.0, probe_s: float = 30.0) -> Preflight:
    """Check the engines (see the module's docstring); at most about
    ``timeout_s`` per call on the way and ``probe_s`` per probe prefill.

    Raises:
        PreflightError: the first cause found, naming the field, URL and what is wrong.
    """
    import uuid

    import httpx

    named = _named("remote.prefill_urls", prefill_urls) + _named("remote.decode_urls",
                                                                 decode_urls)
    with httpx.Client(timeout=timeout_s, headers=bearer(api_key)) as http:
        for name, url in named:
            r = _get(http, name, f"{url}/health")
            if r.status_code != 200:
                raise PreflightError(f"{name}: /health answered {r.status_code} "
                                     f"{r.text[:200]!r}")
        served = [(name, served_models(http, name, url, protocol)) for name, url in named]
        chosen = pick_model(served, model)
        if protocol != "vllm" or kv_handoff == "auto":  # auto: any answer will do
            return Preflight(chosen, "auto")
        seen = set()
        http.timeout = httpx.Timeout(probe_s, connect=timeout_s)
        for name, url in named[:len(prefill_urls)]:
            seen.add(probe_vllm_prefill(http, name, url, chosen, kv_handoff,
                                        f"br-preflight-{uuid.uuid4().hex[:12]}"))
    if len(seen) > 1:
        raise PreflightError("remote.prefill_urls: some prefill servers answer with "
                             "kv_transfer_params and some without; use one connector")
    return Preflight(chosen, seen.pop())

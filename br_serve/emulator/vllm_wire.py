"""vLLM's own response shapes (0.32, checked against the real server by
tests/realvllm/test_conformance.py): the fields it adds to OpenAI's, which it sends even
when they are empty (``null``), and where each goes.

Non-streamed: a completion choice adds ``stop_reason``, ``token_ids``,
``prompt_logprobs``, ``prompt_token_ids`` and ``routed_experts``; a chat choice
``stop_reason``, ``token_ids`` and ``routed_experts``, its message ``refusal``,
``annotations``, ``audio``, ``function_call`` and ``reasoning``, and the chat body
``prompt_logprobs``, ``prompt_token_ids`` and ``prompt_text``. Both bodies add
``service_tier``, ``system_fingerprint``, ``usage.prompt_tokens_details``,
``usage.completion_tokens_details``, ``kv_transfer_params``, ``ec_transfer_params`` and
``metrics``.

Streamed: a chunk has no ``usage`` key unless ``continuous_usage_stats`` (a chat
chunk's usage then also has ``completion_tokens_details``); a completion chunk's choice
adds ``stop_reason``, ``prompt_token_ids`` and ``token_ids``; a chat stream opens with a
role chunk carrying ``prompt_token_ids`` and ``prompt_text``, its token chunks add
``token_ids`` and the last one ``stop_reason``; ``system_fingerprint`` goes on the
usage chunk, or on the last token chunk when there is none.
"""

from __future__ import annotations

import json
from typing import Any

from br_serve.emulator.openai import ChunkWriter, ParsedRequest, usage

#: vLLM's is ``vllm-<version>-<hash>``
FINGERPRINT = "vllm-br-emulated"


def vllm_body(body: dict[str, Any], req: ParsedRequest) -> dict[str, Any]:
    """``body`` (:func:`~br_serve.emulator.openai.completion_body`) in vLLM's shape;
    keeps a ``kv_transfer_params`` already there."""
    choice = dict(body["choices"][0])
    choice.setdefault("stop_reason", None)
    choice["token_ids"] = None
    if req.chat:
        choice["message"] = {**choice["message"], "refusal": None, "annotations": None,
                             "audio": None, "function_call": None, "reasoning": None}
    else:
        choice["prompt_logprobs"] = None
        choice["prompt_token_ids"] = None
    choice["routed_experts"] = None
    out = {k: body[k] for k in ("id", "object", "created", "model")}
    out["choices"] = [choice]
    out["service_tier"] = None
    out["system_fingerprint"] = FINGERPRINT
    out["usage"] = {**body["usage"], "prompt_tokens_details": None,
                    "completion_tokens_details": None}
    if req.chat:
        out.update(prompt_logprobs=None, prompt_token_ids=None, prompt_text=None)
    out["kv_transfer_params"] = body.get("kv_transfer_params")
    out["ec_transfer_params"] = None
    out["metrics"] = None
    return out


class VllmChunkWriter(ChunkWriter):
    """:class:`ChunkWriter` with vLLM's chunk shapes (module docstring)."""

    def _chunk(self, choices: list[dict[str, Any]], use: dict[str, Any] | None,
               **top: Any) -> bytes:
        body: dict[str, Any] = {"id": self.rid, "object": self.obj, "created": self.created,
                                "model": self.req.model, "choices": choices}
        if use is not None:
            body["usage"] = use
        body.update(top)
        return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"

    def _usage(self, emitted: int) -> dict[str, Any] | None:
        if not self.req.continuous_usage:
            return None
        use: dict[str, Any] = usage(self.req.prompt_tokens, emitted)
        if self.req.chat:
            use["completion_tokens_details"] = None
        return use

    def role(self) -> bytes | None:
        if not self.req.chat:
            return None
        return self._chunk([{"index": 0, "delta": {"role": "assistant", "content": ""},
                             "logprobs": None, "finish_reason": None}], self._usage(0),
                           prompt_token_ids=None, prompt_text=None)

    def token(self, text: str, emitted: int, finished: bool) -> bytes:
        choice: dict[str, Any] = {"index": 0}
        if self.req.chat:
            choice["delta"] = {"content": text}
        else:
            choice["text"] = text
        choice["logprobs"] = None
        choice["finish_reason"] = "length" if finished else None
        if not self.req.chat:
            choice.update(stop_reason=None, prompt_token_ids=None)
        elif finished:
            choice["stop_reason"] = None
        choice["token_ids"] = None
        top = ({"system_fingerprint": FINGERPRINT}
               if finished and not self.req.include_usage else {})
        return self._chunk([choice], self._usage(emitted), **top)

    def final_usage(self, emitted: int) -> bytes | None:
        if not self.req.include_usage:
            return None
        return self._chunk([], usage(self.req.prompt_tokens, emitted),
                           system_fingerprint=FINGERPRINT)

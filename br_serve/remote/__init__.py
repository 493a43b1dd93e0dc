"""Ray-free client pieces for remote vLLM / vllm-ascend and SGLang PD engines.

- :mod:`~br_serve.remote.requests`: prefill / decode request builders
  (``kv_transfer_params`` round trip, SGLang bootstrap fields, DP-rank pinning);
- :mod:`~br_serve.remote.sse`: incremental parser of a decode stream;
- :mod:`~br_serve.remote.loads`: per-rank load from ``/metrics`` and ``/v1/loads``;
- :mod:`~br_serve.remote.client`: the async HTTP client with explicit timeouts;
- :mod:`~br_serve.remote.errors`: the exceptions it raises.

The contracts are in docs/engine-contracts.md.
"""

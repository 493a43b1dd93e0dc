"""The ingress room: the OpenAI-compatible HTTP and handle API, overload gate, a
request's stream from prefill to last token, and the ingress's I/O mixin."""

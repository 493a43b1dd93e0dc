"""A protocol-faithful emulator of vLLM / vllm-ascend and SGLang PD engine servers.

``br-serve emulate-engine`` (see :mod:`br_serve.emulator.cli`); the contracts it follows
are written down in docs/engine-contracts.md.
"""

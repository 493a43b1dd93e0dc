"""The prefill room: the Prefill deployment over a local engine (:mod:`.worker`), and the
calls to a remote PD engine's prefill servers that each ingress replica makes itself
(:mod:`.remote`)."""

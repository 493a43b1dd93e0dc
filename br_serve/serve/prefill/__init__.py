"""The prefill room: the Prefill deployment over a local engine (:mod:`.worker`) or a
remote PD engine (:mod:`.remote`)."""

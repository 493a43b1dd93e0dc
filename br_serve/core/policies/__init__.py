"""Built-in policies (related ones share a module: ``baselines``, ``peers``, ``smg``,
``vllm_router``). The policy registry imports every module of this package the first
time a policy name is looked up, so a new built-in needs no registration elsewhere."""

"""Benchmarks that ship with the package (run through ``br-serve``), and the pieces the
repository's benchmark scripts share: :mod:`br_serve.bench.workloads` (the shared trace
workloads and stationary protocol) and :mod:`br_serve.bench.results_render` (the renderer
of docs/results.md)."""

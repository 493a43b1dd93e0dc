"""Benchmarks that ship with the package (run through ``br-serve``)."""

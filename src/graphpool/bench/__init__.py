"""Benchmarks: decode step (eager, graph, compile, HBM floor), graph memory, serving trace."""

"""Reference workloads shared by the demo, the benchmarks and the tests."""

"""The dev-tools layer: what the demo, the benchmarks and the tests use to drive a stack, never
used by a running pipeline. Its modules: README, "Architecture"; docs/local-kafka.md."""

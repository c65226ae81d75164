"""Data for tests and benchmarks (never used at run time): seeded, upstream-like codec streams."""

"""The benchmarks, each run from the checkout's root as `python -m bench.NAME` (BENCHMARKS.md);
`python -m bench.run_all` runs them all. They drive the stack with codeclog.devtools."""

"""The fold: a pure per-request codec-stream state machine, its replay report and scenarios.

Imports neither torch, Kafka, Avro nor the vocoder (an import-linter contract in pyproject.toml).
"""

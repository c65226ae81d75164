"""The fold: a pure per-request codec-stream state machine and its replay report; no torch, Kafka,
Avro or vocoder (an import-linter contract). Its rules and modules: docs/fold-contract.md."""

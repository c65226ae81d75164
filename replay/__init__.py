"""Capture streams from the log and replay them offline, deterministically.

- capture_format: the capture file (Avro OCF): CapturedRecord, CaptureMetadata, writer, reader.
- capture: reading a topic into a capture (read_committed, assign(), end = LSO at start).
- inputs: a replay input (capture or JSONL scenario) in log order.
- runner: the replay itself, through consumers.stream.pipeline.AudioPipeline (the live driver).
- summary: the human report; diff: first divergence per request; republish: --to-topic.
- wav, progress, synthetic (broker-free captures for tests and benches), errors.
"""

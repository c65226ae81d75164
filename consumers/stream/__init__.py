"""The pure stream core that the live member, replay and verify share: the fold (`fold/`, the
per-request rules), the pipeline (wire decode, fold, batched vocoder decode; no I/O) and the
open-stream limit (`limit`). No Kafka client here."""

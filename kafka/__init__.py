"""The Kafka access layer: every client codeclog builds, and the one way each is built.
Its modules: README, "Architecture"."""

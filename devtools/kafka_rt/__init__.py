"""Maven pom and log4j2 configs of the local Kafka broker (package data, read by broker.py)."""

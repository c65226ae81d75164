"""Avro schemas and the typed records of the wire contract."""

"""The Kafka access layer: every client codeclog builds, and the one way each is built.

`log` routes librdkafka's own lines to a Python logger (`client_settings`), `access` probes the
cluster once and names refusals, `calls` bounds the calls that can wait and tells failures
apart, `reader` reads committed records without a group, `records` is a record as read,
`topics` and `acls` create topics and apply ACLs on any cluster.
"""

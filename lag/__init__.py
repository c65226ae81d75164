"""Consumer-lag measurement, evaluation and alerting."""

"""Code2Wav side: the pure fold and the consumer service."""

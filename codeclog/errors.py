"""The one exception base of codeclog. Narrow subclasses live next to the code that raises them."""


class CodeclogError(Exception):
    """Base of every error codeclog raises on purpose."""

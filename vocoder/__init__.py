"""Token2wav (flow + HiFT) vocoder with explicit per-request streaming state."""

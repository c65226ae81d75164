"""The HiFT vocoders (mel -> 24 kHz audio): scheme A's non-causal generator and scheme B's
causal one, each with its streaming rule (docs/vocoder.md, "HiFT, scheme A")."""

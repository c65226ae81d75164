"""The live consumer-group member (`codeclog vocode`): one idea per module.
The modules: docs/operating.md, "The code"."""

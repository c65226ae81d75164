"""Readers of the audio topic: `listener` (a serving process plays every window once),
`verify` (the operator's oracle: the audio topic against an offline replay), and
`audio_compare` (how two copies of a window are compared, within and across domains)."""

"""`codeclog report`: a capture or scenario as one self-contained HTML page (docs/report.md):
`timeline`, `model`, `audio`, `render`, `writer`."""

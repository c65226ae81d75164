"""`codeclog report`: a capture or scenario as one self-contained HTML page (docs/report.md).

- timeline: every input record with what the fold did to it (the timeline's marks).
- model: the page's data: replay's reports per policy, the timeline, divergences, audio.
- audio: a request's audio as an inline WAV and the peaks of its waveform.
- render: the Jinja2 template with its script, styles, ECharts and data inlined.
- writer: check the output, load the inputs, build, write (the command's work).
"""

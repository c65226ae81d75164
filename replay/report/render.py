"""The report page: a Jinja2 template, with its script, styles, charting library and data
inlined, so the one HTML file works offline (docs/report.md, "Why these libraries")."""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import jinja2

from codeclog.replay.errors import ReplayError

ECHARTS_VERSION = "6.1.0"
ECHARTS_FILE = "echarts.common.min.js"
_PACKAGE = "codeclog.replay.report"
_INLINE_ASSETS = {"echarts_js": ECHARTS_FILE, "report_js": "report.js", "report_css": "report.css"}


def asset_text(name: str) -> str:
    return resources.files(_PACKAGE).joinpath("assets").joinpath(name).read_text(encoding="utf-8")


@functools.cache
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader(_PACKAGE, "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def _inline(name: str) -> str:
    """An asset to paste into a <script> or <style> element: it must not end the element."""
    text = asset_text(name)
    if "</script" in text.lower() or "</style" in text.lower():
        raise ReplayError(f"the report asset {name} cannot be inlined (it closes its element)")
    return text


def render_page(page: dict[str, Any]) -> str:
    """The whole HTML file for `page` (model.build_page's data)."""
    template = _environment().get_template("report.html.j2")
    assets = {key: _inline(name) for key, name in _INLINE_ASSETS.items()}
    # the script's data: everything but the audio, which the page holds once, in its players
    script_data = {
        **page,
        "inputs": [{k: v for k, v in view.items() if k != "audio"} for view in page["inputs"]],
    }
    return template.render(
        page=page, script_data=script_data, echarts_version=ECHARTS_VERSION, **assets
    )

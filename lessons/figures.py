"""The lessons' numbers: `lessons/figures.json`, the one place every figure the lessons, quiz,
glossary and page strings quote is written, each with its source (a paper's citation, a
command and its machine, or the arithmetic that gives it).

Texts write `{{figure:NAME}}` for a figure and `{{source:NAME}}` for a source;
`fill_figures(text, lang)` replaces them, and an unknown name is a ValueError naming where.
It lives beside the data it reads and imports nothing of the project, so the app (lessons,
page strings) and the classroom (a self-test question sent to the phones) fill the same way.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

LESSONS_DIR = Path(__file__).resolve().parent  # the package's data, in a checkout or a wheel
LANGS = ("zh", "en")  # app.i18n.LANGS (tests/test_claims.py checks they agree)


FIGURE_REF = re.compile(r"\{\{(figure|source):([A-Za-z0-9_-]+)\}\}")
SOURCE_KINDS = ("paper", "measured", "computed")
# How a value and its unit read in each language; units not listed read "{v} {unit}".
_UNIT_FORMS = {
    "x": {"en": "{v}x", "zh": "{v} 倍"},
    "%": {"en": "{v}%", "zh": "{v}%"},
    "": {"en": "{v}", "zh": "{v}"},
    "ms": {"en": "{v} ms", "zh": "{v} 毫秒"},
}


@lru_cache(maxsize=1)
def load_figures() -> dict:
    """`lessons/figures.json`: {"sources": {name: {...}}, "figures": {name: {...}}}, checked:
    every figure has a value, decimals, a unit and a known source; a measured source names
    its command and machine (both languages), a computed figure its formula."""
    data = json.loads((LESSONS_DIR / "figures.json").read_text(encoding="utf-8"))
    check_figures(data)
    return data


def check_figures(data: object) -> None:
    """ValueError naming the first figure or source that lacks what it must say."""
    if not isinstance(data, dict) or not isinstance(data.get("sources"), dict) \
            or not isinstance(data.get("figures"), dict):
        raise ValueError("figures: must be an object with 'sources' and 'figures' objects")
    for name, src in data["sources"].items():
        kind = src.get("kind") if isinstance(src, dict) else None
        if kind not in SOURCE_KINDS:
            raise ValueError(f"figures: source {name!r} needs a kind in {SOURCE_KINDS}")
        if kind == "measured":
            machine = src.get("machine")
            if not src.get("command") or not isinstance(machine, dict) \
                    or not all(str(machine.get(lang, "")).strip() for lang in LANGS):
                raise ValueError(f"figures: measured source {name!r} needs a command and a "
                                 f"machine in {list(LANGS)}")
        elif not str(src.get("cite", "")).strip():
            raise ValueError(f"figures: source {name!r} needs a cite")
    for name, fig in data["figures"].items():
        if not isinstance(fig, dict):
            raise ValueError(f"figures: {name!r} must be an object")
        value = fig.get("value")
        values = value if isinstance(value, list) else [value]
        if not values or len(values) > 2 or not all(isinstance(v, (int, float)) for v in values):
            raise ValueError(f"figures: {name!r} needs a number or a [low, high] range as value")
        if not isinstance(fig.get("decimals"), int) or not isinstance(fig.get("unit"), str):
            raise ValueError(f"figures: {name!r} needs integer decimals and a unit string")
        src = data["sources"].get(fig.get("source"))
        if src is None:
            raise ValueError(f"figures: {name!r} names no known source ({fig.get('source')!r})")
        if src["kind"] == "computed" and not str(fig.get("formula", "")).strip():
            raise ValueError(f"figures: computed figure {name!r} needs its formula")


def figure_text(name: str, lang: str, data: dict | None = None) -> str:
    """A figure as a reader sees it in `lang`, e.g. "1.52x" / "1.52 倍", "20.4–38.2%"."""
    data = data or load_figures()
    fig = data["figures"].get(name)
    if fig is None:
        raise ValueError(f"no figure {name!r} in lessons/figures.json")
    values = fig["value"] if isinstance(fig["value"], list) else [fig["value"]]
    number = "–".join(f"{v:,.{fig['decimals']}f}" for v in values)
    unit = fig["unit"]
    form = _UNIT_FORMS.get(unit, {"en": "{v} " + unit, "zh": "{v} " + unit})
    return form["en" if lang == "en" else "zh"].format(v=number)


def source_text(name: str, lang: str, data: dict | None = None) -> str:
    """A source as a reader sees it: a paper's citation, or "`command`, machine"."""
    data = data or load_figures()
    src = data["sources"].get(name)
    if src is None:
        raise ValueError(f"no source {name!r} in lessons/figures.json")
    if src["kind"] == "measured":
        machine = src["machine"]["en" if lang == "en" else "zh"]
        return f"`{src['command']}`，机器：{machine}" if lang == "zh" else \
            f"`{src['command']}` on {machine}"
    return src["cite"]


# What a figure is, as a reader is told next to it: a source's kind as the reader's word. A
# "measured" source is a recorded run (its command, machine and date in figures.json); what
# a page measures live on this machine it says itself.
KIND_WORDS = {"paper": {"zh": "引用", "en": "cited"},
              "measured": {"zh": "记录", "en": "recorded"},
              "computed": {"zh": "计算", "en": "computed"}}
TAGS = ("", "words", "badge")


def figure_kind(name: str, lang: str, data: dict | None = None) -> str:
    """The figure's kind in `lang`'s word: cited, recorded or computed (KIND_WORDS)."""
    data = data or load_figures()
    fig = data["figures"].get(name)
    if fig is None:
        raise ValueError(f"no figure {name!r} in lessons/figures.json")
    kind = data["sources"][fig["source"]]["kind"]
    return KIND_WORDS[kind]["en" if lang == "en" else "zh"]


def fill_figures(text: str, lang: str, where: str = "text", tag: str = "") -> str:
    """`text` with each `{{figure:NAME}}` and `{{source:NAME}}` replaced; ValueError naming
    `where` and the name when one is unknown. `tag` marks each figure with its kind: "words"
    in brackets ("1.52 倍（记录）", "1.52x (recorded)": any text, a phone's too), "badge" as
    a small Streamlit markdown badge (a page's markdown), "" not at all (a number a sentence
    already names the kind of)."""
    if "{{" not in text:
        return text
    if tag not in TAGS:
        raise ValueError(f"tag must be one of {TAGS}")
    data = load_figures()

    def one(m: re.Match) -> str:
        try:
            if m.group(1) == "source":
                return source_text(m.group(2), lang, data)
            shown = figure_text(m.group(2), lang, data)
            kind = figure_kind(m.group(2), lang, data)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        if tag == "words":
            return f"{shown}（{kind}）" if lang != "en" else f"{shown} ({kind})"
        if tag == "badge":
            return f"{shown} :gray-badge[{kind}]"
        return shown

    return FIGURE_REF.sub(one, text)


def figure_names(text: str) -> set[str]:
    """The figure names `text` refers to."""
    return {m.group(2) for m in FIGURE_REF.finditer(text) if m.group(1) == "figure"}

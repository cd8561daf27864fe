"""The Classroom page's click on a student: the latest students' nicknames as buttons (the
names the projector shows, so a hidden one reads "(hidden)" and a masked one stars: the rows
come from `mask_owners`), and under them the picked request's timeline, stretch by stretch,
as the class server keeps it (`GET /v1/servelab/class/timeline/{id}`, the same stretches the
student's phone draws after the answer)."""

from __future__ import annotations

import re
from collections.abc import Callable

import streamlit as st

from app.components.classroom import CHIP_WIDTH, fit, timeline_html
from app.i18n import t

KEY = "cls_timeline_pick"
CACHE = "_cls_timelines"  # finished requests' timelines, fetched once


# what Streamlit's markdown reads in a button's label (emphasis, links, raw HTML, math,
# emoji codes...): each is shown as itself behind a backslash
_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~:$&=])")


def md_escape(text: str) -> str:
    """`text` as a label Streamlit shows as it is (a nickname of stars is no rule, a
    `<script>` no tag)."""
    return _MARKDOWN.sub(r"\\\1", text)


def unique_labels(rows: list[dict]) -> dict[str, str]:
    """Request id -> the name its button shows: the shown nickname, fitted, "·2", "·3" when
    two read alike (a button group tells its options apart by their text)."""
    labels: dict[str, str] = {}
    seen: dict[str, int] = {}
    for r in rows:
        name = fit(r["nickname"], CHIP_WIDTH)
        n = seen[name] = seen.get(name, 0) + 1
        labels[r["request_id"]] = name if n == 1 else f"{name}·{n}"
    return labels


def timeline_picker(rows: list[dict], fetch: Callable[[str], dict | None]) -> None:
    """The nicknames of `rows` (student_rows, from masked owners) as buttons; the picked
    one's timeline from `fetch(request_id)` (None: the server no longer keeps it)."""
    if not rows:
        return
    labels = unique_labels(rows)
    pick = st.pills(t("cls.timeline.pick"), list(labels),
                    format_func=lambda rid: md_escape(labels[rid]), key=KEY,
                    help=t("cls.timeline.pick.help"))
    if pick is None or pick not in labels:
        return
    cache = st.session_state.setdefault(CACHE, {})
    data = cache.get(pick)
    if data is None:
        data = fetch(pick)
        if data is not None and data.get("done"):
            cache[pick] = data
            while len(cache) > 64:
                cache.pop(next(iter(cache)))
    if data is None:
        st.caption(t("cls.timeline.gone"))
        return
    st.html(timeline_html(data.get("timeline") or [], labels[pick]))

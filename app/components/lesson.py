"""Draw a lesson (lessons/<lang>/<slug>.md) and its one-click "try it" links.

Live pages call `render_lesson(slug)` inside the column next to their live view. A link opens
the page with the switches in its query string (`demo_url`); inside the app shell it is an
`st.page_link` (same tab, session kept), and when the target page is not registered (a page run
on its own, as in tests) a plain markdown link to the same URL.
"""

from __future__ import annotations

import streamlit as st
from streamlit.errors import StreamlitAPIException

from app.i18n import get_lang, switch_label, t
from app.lessons import DemoLink, lesson_try_it, load_lesson
from app.pagelist import page_info


def describe_switches(switches: dict[str, str]) -> str:
    """'Batching: continuous (subway) · KV layout: paged' in the current language."""
    return " · ".join(f"{switch_label(k)}: {switch_label(k, v)}" for k, v in switches.items())


def demo_link(label: str, link: DemoLink, key: str | None = None) -> None:
    """A link that opens `link.page` with `link.switches` set."""
    try:
        st.page_link(page_info(link.page).file, label=label, query_params=link.switches, icon="▶️")
    except StreamlitAPIException:
        st.markdown(f"▶️ [{label}]({link.url})")


def render_lesson(slug: str) -> None:
    """The lesson for `slug` in the current language, then a link per try-it step."""
    lang = get_lang()
    st.markdown(load_lesson(slug, lang))
    st.caption(t("lesson.try_links"))
    for n, link in enumerate(lesson_try_it(slug, lang), start=1):
        page = t(f"page.{link.page}")
        label = f"{t('lesson.step', n=n)} — {page}: {describe_switches(link.switches)}"
        demo_link(label, link)

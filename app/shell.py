"""The shell every page shares: the page list, the model loaded once per server, the sidebar
and the device line.

`app/main.py` calls `st.navigation(pages())`, draws `shell()` and runs the selected page.
Streamlit also has an older mode for apps with a `pages/` folder: until some run calls
`st.navigation`, a deep link such as /paging on a freshly started server (and every page
after AppTest's `switch_page`) runs the page file alone, without main.py. A page therefore
calls `ensure_shell()` first: when main.py did not draw the shell in this run, it calls
`st.navigation` (which switches the server to navigation mode for good) and reruns, so
main.py draws the shell and runs the page as usual.
"""

from __future__ import annotations

from contextlib import contextmanager

import streamlit as st

from app.i18n import t
from app.live import ensure_model, get_session
from app.sidebar import device_line, draw_sidebar

DRAWN = "_shell_drawn_this_run"

SECTIONS = {
    "nav.start": ("home",),
    "nav.leaks": ("batching", "paging", "speculation"),
    "nav.measure": ("dashboard", "beyond"),
    "nav.check": ("quiz", "glossary"),
    "nav.class": ("classroom",),
}


def _root() -> None:
    """The app's root URL opens the home page at /home, keeping the query string."""
    st.switch_page("pages/home.py", query_params=st.query_params.to_dict())


def pages() -> dict[str, list[st.Page]]:
    """The navigation: a section per part of the chapter, one page per lesson slug.

    Streamlit serves its default page at "/" and then answers its own url_path with "page
    not found"; the lessons' demo links open "/home?...". So the default page is a hidden
    one that switches to home: "/" and "/home" both show the home page.
    """
    # No page icons: Streamlit shows the first page's icon as the favicon, and a material
    # icon favicon is fetched from fonts.gstatic.com (a classroom may be offline).
    nav = {t(key): [st.Page(f"pages/{slug}.py", title=t(f"page.{slug}"), url_path=slug)
                    for slug in slugs]
           for key, slugs in SECTIONS.items()}
    root = st.Page(_root, title=t("page.home"), url_path="start", default=True,
                   visibility="hidden")
    nav[t("nav.start")].insert(0, root)
    return nav


def shell() -> None:
    session = get_session()
    ensure_model(session.settings.model)
    draw_sidebar(session)
    try:
        device_line(session.primary.engine.describe())
    except ValueError as exc:  # a KV budget too small for one request, for example
        st.sidebar.error(t("live.build_error", msg=str(exc)))


@contextmanager
def shell_drawn():
    """Mark the shell as drawn for the page run inside this block."""
    st.session_state[DRAWN] = True
    try:
        yield
    finally:
        st.session_state.pop(DRAWN, None)


def ensure_shell() -> None:
    """Rerun through main.py when this page runs without it (see the module docstring)."""
    if not st.session_state.get(DRAWN):
        st.navigation(pages())
        st.rerun()

"""The navigation: `st.navigation` built from the page table (app/pagelist.py), and the guard
that sends a page run on its own back through app/main.py.

Streamlit also has an older mode for apps with a `pages/` folder: until some run calls
`st.navigation`, a deep link such as /paging on a freshly started server (and every page
after AppTest's `switch_page`) runs the page file alone, without main.py. A live page therefore
calls `ensure_shell()` first: when main.py did not draw the shell in this run, it calls
`st.navigation` (which switches the server to navigation mode for good) and reruns, so
main.py draws the shell and runs the page as usual.

This module imports no other app module that draws; app/shell.py (the sidebar and the model)
and app/live.py (the live view) both import it, never the other way round.
"""

from __future__ import annotations

from contextlib import contextmanager

import streamlit as st

from app.i18n import t
from app.pagelist import PAGE_TABLE, sections

DRAWN = "_shell_drawn_this_run"


def _root() -> None:
    """The app's root URL opens the first page of the table, keeping the query string."""
    st.switch_page(PAGE_TABLE[0].file, query_params=st.query_params.to_dict())


def pages() -> dict[str, list[st.Page]]:
    """The navigation: a section per part of the chapter, one page per row of the table.

    Streamlit serves its default page at "/" and then answers its own url_path with "page
    not found"; the lessons' demo links open "/<slug>?...". So the default page is a hidden
    one that switches to the first page: "/" and "/<first slug>" both show it.
    """
    # No page icons: Streamlit shows the first page's icon as the favicon, and a material
    # icon favicon is fetched from fonts.gstatic.com (a classroom may be offline).
    nav = {t(key): [st.Page(p.file, title=t(p.title_key), url_path=p.slug) for p in rows]
           for key, rows in sections().items()}
    first = PAGE_TABLE[0]
    root = st.Page(_root, title=t(first.title_key), url_path="start", default=True,
                   visibility="hidden")
    nav[t(first.section)].insert(0, root)
    return nav


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

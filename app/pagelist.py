"""The app's pages in one table: what the navigation, the lessons, the home map and the tests
all read.

Adding a page is one row here, one file `app/pages/<slug>.py`, its title string `page.<slug>`
in app/i18n.py and, when `lesson` is true, `lessons/{zh,en}/<slug>.md`. Everything else (the
sections of `st.navigation`, which pages have a lesson, which pages step the engine, the tests
that open every page) follows from the row.

Pure Python, no streamlit: `app/lessons.py` and the tests import it without a browser session.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PageInfo:
    """One page: its slug (file name and URL path), navigation section and what it holds."""

    slug: str
    section: str  # the i18n key of its navigation section ("nav.*")
    lesson: bool  # lessons/<lang>/<slug>.md exists and is drawn beside the page
    icon: str  # a Material icon, shown on the home map and the class plan (not in the nav)
    # Runs the session's engine: the page draws the shell (sidebar, model) first. The other
    # pages are text and run without a model, also on their own (tests/app/test_quiz_page.py).
    live: bool = False
    # Runs an engine of its own (the classroom's class server, a child process): the sidebar
    # shows the language only, not the single-user switches and Step / Play, which would drive
    # the session's engine, not the one on the projector.
    own_engine: bool = False

    @property
    def title_key(self) -> str:
        """The i18n key of the page's title."""
        return f"page.{self.slug}"

    @property
    def file(self) -> str:
        """The page's script, relative to app/ (what st.Page and st.switch_page take)."""
        return f"pages/{self.slug}.py"


# In navigation order; sections appear in the order of their first page.
PAGE_TABLE: tuple[PageInfo, ...] = (
    PageInfo("plan", "nav.start", False, ":material/checklist:", live=True),
    PageInfo("home", "nav.start", True, ":material/home:", live=True),
    PageInfo("batching", "nav.leaks", True, ":material/directions_subway:", live=True),
    PageInfo("paging", "nav.leaks", True, ":material/grid_view:", live=True),
    PageInfo("speculation", "nav.leaks", True, ":material/bolt:", live=True),
    PageInfo("dashboard", "nav.measure", True, ":material/speed:", live=True),
    PageInfo("calculators", "nav.measure", False, ":material/calculate:", live=True),
    PageInfo("beyond", "nav.measure", True, ":material/explore:"),
    PageInfo("summary", "nav.check", False, ":material/summarize:"),
    PageInfo("quiz", "nav.check", False, ":material/quiz:"),
    PageInfo("glossary", "nav.check", False, ":material/menu_book:"),
    PageInfo("classroom", "nav.class", False, ":material/groups:", live=True, own_engine=True),
)

PAGES: tuple[str, ...] = tuple(p.slug for p in PAGE_TABLE)
LESSON_PAGES: tuple[str, ...] = tuple(p.slug for p in PAGE_TABLE if p.lesson)
LIVE_PAGES: tuple[str, ...] = tuple(p.slug for p in PAGE_TABLE if p.live)
OWN_ENGINE_PAGES: tuple[str, ...] = tuple(p.slug for p in PAGE_TABLE if p.own_engine)
LEAK_PAGES: tuple[str, ...] = tuple(p.slug for p in PAGE_TABLE if p.section == "nav.leaks")


def page_info(slug: str) -> PageInfo:
    """The row of `slug`; ValueError naming the known slugs when there is none."""
    for p in PAGE_TABLE:
        if p.slug == slug:
            return p
    raise ValueError(f"unknown page {slug!r}; pages are {', '.join(PAGES)}")


def sections() -> dict[str, list[PageInfo]]:
    """Section key -> its pages, both in table order."""
    out: dict[str, list[PageInfo]] = {}
    for p in PAGE_TABLE:
        out.setdefault(p.section, []).append(p)
    return out

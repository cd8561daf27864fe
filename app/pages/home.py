"""Home, "same card, many times the users": a live race between the naive server and the engine
on this machine, the map of the three leaks with links to their pages, and the lesson.

The race runs when the teacher presses its button (it takes a while on a CPU); the result
stays in the browser session until it is run again.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import streamlit as st  # noqa: E402

from app.components.charts import race_chart  # noqa: E402
from app.components.lesson import demo_link  # noqa: E402
from app.i18n import t  # noqa: E402
from app.lessons import DemoLink  # noqa: E402
from app.live import get_session, measured, page_with_lesson  # noqa: E402
from app.pagelist import LEAK_PAGES, page_info  # noqa: E402
from app.predict import current_stop, prediction_box  # noqa: E402
from app.race import RACE_MAX_TOKENS, RACE_REQUESTS, race  # noqa: E402

RESULT = "race_result"


def draw_race(first: bool = False) -> None:
    """The race; `first` (the class is at its stop): the prediction and the button come
    before the race's description, so both are on a projector's first screen."""
    session = get_session()
    st.subheader(t("home.race"))

    def describe() -> None:
        st.caption(t("home.race.what", n=RACE_REQUESTS, cap=RACE_MAX_TOKENS,
                     seats=session.settings.seats))
        st.caption(t("home.race.differs"))

    if not first:
        describe()
    box = st.container()
    result = measured(RESULT, "race_start", t("home.race.start"),
                      lambda progress: race(session.settings.seats, session.settings.model,
                                            RACE_REQUESTS, RACE_MAX_TOKENS, progress=progress),
                      type="primary")
    if first:
        describe()
    with box:
        prediction_box("home", [], {"race": result})
    if result is None:
        st.info(t("home.race.not_yet"))
        return
    naive, engine = result["naive"], result["engine"]
    a, b, c = st.columns(3)
    a.metric(t("home.race.naive"), f"{naive['tokens_per_s']:.1f} tok/s", border=True)
    b.metric(t("home.race.engine"), f"{engine['tokens_per_s']:.1f} tok/s", border=True)
    ratio = result["ratio"]
    c.metric(t("home.race.ratio"), "—" if ratio is None else f"×{ratio:.2f}", border=True)
    rows = [{"system": t("home.race.naive"), "tokens_per_s": naive["tokens_per_s"]},
            {"system": t("home.race.engine"), "tokens_per_s": engine["tokens_per_s"]}]
    st.altair_chart(race_chart(rows), width="stretch")
    st.caption(t("home.race.detail", nt=naive["tokens"], ns=naive["wall_s"],
                 et=engine["tokens"], es=engine["wall_s"], device=engine["device"]))
    if ratio is not None and ratio < 1.5:
        st.info(t("home.race.small_gap"))


def draw_map() -> None:
    st.subheader(t("home.map"))
    for col, slug in zip(st.columns(len(LEAK_PAGES)), LEAK_PAGES):
        with col.container(border=True):
            st.markdown(f"### {page_info(slug).icon} {t(f'home.leak.{slug}')}")
            st.markdown(t(f"home.leak.{slug}.what"))
            st.markdown(f"**{t('home.fix')}:** {t(f'home.leak.{slug}.fix')}")
            st.markdown(f"**{t('home.improves')}:** {t(f'home.leak.{slug}.gain')}")
            demo_link(t(f"page.{slug}"), DemoLink(slug))


def body() -> None:
    st.header(t("home.headline"))
    if current_stop("home"):  # the class is at the race: its prediction and button come first
        draw_race(first=True)
        st.markdown(t("home.intro"))
        draw_map()
        return
    st.markdown(t("home.intro"))
    draw_map()
    draw_race()


page_with_lesson("home", body, title=t("app.title"))

"""The chapter's summary, point by point, each linked to the class-plan stop that showed it
live, with the class's prediction and the measurement when that stop has been run.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import streamlit as st  # noqa: E402

from app.classplan import STOPS, SUMMARY, stop_by_id  # noqa: E402
from app.components.lesson import demo_link  # noqa: E402
from app.i18n import get_lang, language_selector, t  # noqa: E402
from app.lessons import DemoLink  # noqa: E402
from app.predict import PREDICTIONS, REVEALS  # noqa: E402
from app.votes_panel import gains_section  # noqa: E402


def main() -> None:
    language_selector()
    lang = get_lang()
    st.title(t("page.summary"))
    st.caption(t("plan.scale"))
    st.markdown(t("summary.intro"))
    for i, (point, stop_ids) in enumerate(SUMMARY, start=1):
        with st.container(border=True):
            st.markdown(f"**{i}.** {point.get(lang)}")
            for stop_id in stop_ids:
                stop = stop_by_id(stop_id)
                n = STOPS.index(stop) + 1
                label = t("summary.shown_at", n=n, title=stop.title.get(lang))
                demo_link(label, DemoLink(stop.page))
                chosen = st.session_state.get(PREDICTIONS, {}).get(stop_id)
                reveal = st.session_state.get(REVEALS, {}).get(stop_id)
                if stop.prediction and chosen is not None and reveal is not None:
                    value, index = reveal
                    st.caption(t("plan.result", pred=stop.prediction.choices[chosen].get(lang),
                                 value=stop.prediction.value_fmt.format(value),
                                 verdict=t("plan.right" if index == chosen else "plan.wrong")))
    gains_section()


main()

"""The class plan (first in the navigation): chapter 6.4 as a 45-minute class of nine stops
with slack (app/classplan.py), listed in reading order. Each stop: its time, its question, the knobs it sets, and one button that
sets them all, restarts the engine and opens the stop's page, where the students predict
before the engine answers. The teacher's notes (lessons/notes/) sit underneath.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import streamlit as st  # noqa: E402

from app.classplan import CLASS_MINUTES, STOPS, Stop  # noqa: E402
from app.i18n import get_lang, switch_label, t  # noqa: E402
from app.lessons import LESSONS_DIR  # noqa: E402
from app.live import get_session  # noqa: E402
from app.nav import ensure_shell  # noqa: E402
from app.pagelist import page_info  # noqa: E402
from app.predict import GOTO, PREDICTIONS, REVEALS, start_stop  # noqa: E402
from app.votes_panel import open_button, prediction_payload  # noqa: E402
from lessons.figures import fill_figures  # noqa: E402


def knob_text(stop: Stop) -> str:
    """The knobs a stop sets, in the sidebar's words."""
    k = stop.knobs
    parts = [f"{switch_label(n)}: {switch_label(n, k[n])}" for n in ("batching", "kv_layout",
                                                                       "spec")]
    if k["spec"] != "off":
        parts.append(f"k = {k['k']}")
    parts += [f"{t('side.seats')}: {k['seats']}", f"{t('side.blocks')}: {k['num_blocks']}",
              f"{t('side.block_size')}: {k['block_size']}",
              f"{t('side.workload')}: {t('workload.' + k['workload'])}",
              f"{t('side.requests')}: {k['num_requests']}",
              f"{t('side.temperature')}: {k['temperature']:g}"]
    return " · ".join(parts)


def result_line(stop: Stop, lang: str) -> None:
    """The class's prediction against the measurement, once the stop has revealed it."""
    chosen = st.session_state.get(PREDICTIONS, {}).get(stop.id)
    reveal = st.session_state.get(REVEALS, {}).get(stop.id)
    if stop.prediction is None or chosen is None or reveal is None:
        return
    value, index = reveal
    st.caption(t("plan.result", pred=stop.prediction.choices[chosen].get(lang),
                 value=stop.prediction.value_fmt.format(value),
                 verdict=t("plan.right" if index == chosen else "plan.wrong")))


def draw_stop(n: int, stop: Stop, lang: str) -> None:
    with st.container(border=True, key=f"plan_stop_{stop.id}"):
        info = page_info(stop.page)
        st.markdown(f"**{t('plan.stop', n=n, minutes=stop.minutes, page=t(info.title_key))}**"
                    f" — {stop.title.get(lang)}")
        st.markdown(f"{info.icon} {stop.question.get(lang)}")
        st.caption(f"{t('plan.knobs')}: {knob_text(stop)}")
        pred = stop.prediction
        if pred is not None:  # for the teacher: where the chapter says the value lands
            st.caption(t("plan.expect", range=pred.expect_text(lang),
                         why=pred.why.get(lang) if pred.why else ""))
        st.button(t("plan.start"), key=f"plan_{stop.id}", on_click=start_stop,
                  args=(stop, get_session()), type="primary")
        result_line(stop, lang)
        if stop.prediction is not None:
            open_button(prediction_payload(stop), f"plan_{stop.id}")


def main() -> None:
    ensure_shell()
    goto = st.session_state.pop(GOTO, None)
    if goto:  # a stop's button was pressed: its knobs are set, open its page
        st.switch_page(page_info(goto).file)
    lang = get_lang()
    st.title(t("page.plan"))
    st.caption(t("plan.scale"))
    st.markdown(t("plan.intro", n=len(STOPS)))
    minutes = sum(s.minutes for s in STOPS)
    st.caption(f"{t('plan.total', m=minutes)} {t('plan.slack', m=minutes, s=CLASS_MINUTES - minutes)}")
    # two stops a row, so the plan reads 1, 2 / 3, 4 / ... left to right, top to bottom
    for first in range(0, len(STOPS), 2):
        for col, (n, stop) in zip(st.columns(2, gap="medium"),
                                  list(enumerate(STOPS, start=1))[first:first + 2]):
            with col:
                draw_stop(n, stop, lang)
    with st.expander(t("plan.notes"), expanded=False):
        notes = (LESSONS_DIR / "notes" / f"{lang}.md").read_text(encoding="utf-8")
        st.markdown(fill_figures(notes, lang, f"notes/{lang}.md", tag="badge"))


main()

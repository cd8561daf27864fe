"""Lesson page "beyond": what production engines add to the three fixes, and the shelf life
of the chapter's numbers. No live view; its try-it links open the dashboard.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import streamlit as st  # noqa: E402

from app.components.lesson import render_lesson  # noqa: E402
from app.i18n import language_selector, t  # noqa: E402

language_selector()
st.caption(t("plan.scale"))
render_lesson("beyond")
st.caption(t("lesson.live_only_here"))

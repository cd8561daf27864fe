"""Glossary page: the chapter's terms in Chinese and English (lessons/glossary.json), searchable.

The search box matches either language's term or definition, case-insensitively.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import streamlit as st  # noqa: E402

from app.components.lesson import demo_link  # noqa: E402
from app.i18n import get_lang, language_selector, t  # noqa: E402
from app.lessons import DemoLink, Term, load_glossary, search_terms  # noqa: E402


def draw_term(term: Term, lang: str) -> None:
    other = "en" if lang == "zh" else "zh"
    with st.container(border=True):
        st.markdown(f"**{term.term.get(lang)}** · {term.term.get(other)}")
        st.markdown(term.definition.get(lang))
        if term.page:
            demo_link(f"{t('glossary.see_page')}: {t(f'page.{term.page}')}", DemoLink(term.page))


def main() -> None:
    language_selector()
    lang = get_lang()
    terms = load_glossary()

    st.title(t("page.glossary"))
    st.caption(t("plan.scale"))
    st.caption(t("glossary.intro"))
    query = st.text_input(
        t("glossary.search"), key="glossary_search", placeholder=t("glossary.search_help")
    )
    shown = search_terms(terms, query or "")  # file order: grouped by chapter section
    st.caption(t("glossary.count", shown=len(shown), total=len(terms)))
    if not shown:
        st.info(t("glossary.no_match"))
    for term in shown:
        draw_term(term, lang)


main()

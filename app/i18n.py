"""UI strings in Chinese and English, and the language the current browser session reads.

`get_lang()` reads `st.session_state["lang"]`; when it is unset, a browser locale starting with
"en" gives English and anything else Chinese (the chapter's language). `t(key, **fmt)` looks a
string up in `STRINGS` for that language. `language_selector()` draws the sidebar radio bound to
`st.session_state["lang"]`. Lesson text itself lives in `lessons/<lang>/`, not here.
"""

from __future__ import annotations

import streamlit as st
from streamlit.errors import StreamlitDuplicateElementId, StreamlitDuplicateElementKey

LANGS = ("zh", "en")
LANG_LABELS = {"zh": "中文", "en": "English"}

# key -> {"zh": ..., "en": ...}. Keys are dotted by page; add yours, keep both languages.
STRINGS: dict[str, dict[str, str]] = {
    "app.title": {"zh": "ServeLab 推理服务实验室", "en": "ServeLab: an LLM serving lab"},
    "lang.label": {"zh": "语言 / Language", "en": "Language / 语言"},
    # pages
    "page.home": {"zh": "首页：三处漏洞", "en": "Home: three leaks"},
    "page.batching": {"zh": "连续批处理", "en": "Continuous batching"},
    "page.paging": {"zh": "分页 KV 缓存", "en": "Paged KV cache"},
    "page.speculation": {"zh": "投机解码", "en": "Speculative decoding"},
    "page.dashboard": {"zh": "仪表盘", "en": "Dashboard"},
    "page.beyond": {"zh": "三招之外", "en": "Beyond the three"},
    "page.quiz": {"zh": "自测", "en": "Self-test"},
    "page.glossary": {"zh": "术语表", "en": "Glossary"},
    # switches and their values
    "switch.batching": {"zh": "批处理", "en": "Batching"},
    "switch.batching.static": {"zh": "静态（旅游大巴）", "en": "static (tour bus)"},
    "switch.batching.continuous": {"zh": "连续（地铁）", "en": "continuous (subway)"},
    "switch.kv_layout": {"zh": "KV 布局", "en": "KV layout"},
    "switch.kv_layout.contiguous": {"zh": "整块预留（宴会厅）", "en": "contiguous (banquet hall)"},
    "switch.kv_layout.paged": {"zh": "分页", "en": "paged"},
    "switch.spec": {"zh": "投机解码", "en": "Speculation"},
    "switch.spec.off": {"zh": "关闭", "en": "off"},
    "switch.spec.ngram": {"zh": "n-gram 查找", "en": "n-gram lookup"},
    "switch.spec.draft": {"zh": "草稿模型", "en": "draft model"},
    # lessons
    "lesson.try_links": {"zh": "一键设置开关：", "en": "Set the switches in one click:"},
    "lesson.step": {"zh": "第 {n} 步", "en": "Step {n}"},
    "lesson.live_only_here": {
        "zh": "本页没有实时画面；上面的链接会带你去能看到效果的页面。",
        "en": "This page has no live view; the links above open pages that do.",
    },
    # quiz
    "quiz.intro": {
        "zh": "前五题对应本章的「动手自测」，其余是拓展题。答完看解析，再点链接到实时页面验证。",
        "en": "The first five are the chapter's own self-test; the rest go further. "
        "Read the explanation, then open the linked page and check it live.",
    },
    "quiz.chapter_set": {"zh": "本章自测", "en": "The chapter's self-test"},
    "quiz.extra_set": {"zh": "拓展题", "en": "Going further"},
    "quiz.score_chapter": {"zh": "本章自测得分", "en": "Chapter score"},
    "quiz.score_extra": {"zh": "拓展题得分", "en": "Extra score"},
    "quiz.choose": {"zh": "选一个答案", "en": "Pick one answer"},
    "quiz.submit": {"zh": "提交", "en": "Submit"},
    "quiz.pick_first": {"zh": "请先选一个选项再提交。", "en": "Pick a choice before submitting."},
    "quiz.correct": {"zh": "✅ 答对了。", "en": "✅ Correct."},
    "quiz.incorrect": {"zh": "❌ 不对。", "en": "❌ Not quite."},
    "quiz.your_answer": {"zh": "你的答案", "en": "your answer"},
    "quiz.right_answer": {"zh": "正确答案", "en": "the right answer"},
    "quiz.retry": {"zh": "重答这题", "en": "Retry this question"},
    "quiz.reset_all": {"zh": "全部重来", "en": "Reset all"},
    "quiz.try_demo": {"zh": "到实时页面看一看", "en": "See it live"},
    # glossary
    "glossary.intro": {
        "zh": "本章和本应用用到的术语，中英对照。",
        "en": "The terms this chapter and this app use, in Chinese and English.",
    },
    "glossary.search": {"zh": "搜索术语", "en": "Search terms"},
    "glossary.search_help": {
        "zh": "中文或英文都可以，例如 KV、吞吐、prefill",
        "en": "Chinese or English, e.g. KV, throughput, 预填充",
    },
    "glossary.count": {
        "zh": "显示 {shown} / {total} 个术语",
        "en": "Showing {shown} / {total} terms",
    },
    "glossary.no_match": {"zh": "没有匹配的术语。", "en": "No term matches."},
    "glossary.see_page": {"zh": "相关页面", "en": "Related page"},
}


def _default_lang() -> str:
    try:
        locale = st.context.locale or ""
    except Exception:  # no browser context (bare mode, some tests)
        locale = ""
    return "en" if str(locale).lower().startswith("en") else "zh"


def get_lang() -> str:
    """The current session's language: `st.session_state["lang"]`, else from the browser locale."""
    lang = st.session_state.get("lang")
    return lang if lang in LANGS else _default_lang()


def t(key: str, **fmt: object) -> str:
    """The UI string `key` in the current language, formatted with `fmt`; the key if unknown."""
    entry = STRINGS.get(key)
    if entry is None:
        return key
    text = entry.get(get_lang()) or entry["zh"]
    return text.format(**fmt) if fmt else text


def switch_label(name: str, value: str | None = None) -> str:
    """The display name of a switch, or of one of its values."""
    return t(f"switch.{name}" if value is None else f"switch.{name}.{value}")


def language_selector() -> str:
    """Draw the sidebar radio 中文 / English bound to `st.session_state["lang"]`; return the lang.

    Safe to call from both the app shell and a page run on its own: when the shell has already
    drawn it in this run, the second call draws nothing.
    """
    if st.session_state.get("lang") not in LANGS:
        st.session_state["lang"] = _default_lang()
    try:
        st.sidebar.radio(
            STRINGS["lang.label"]["zh"],  # fixed label: one widget id in both languages
            LANGS,
            format_func=LANG_LABELS.__getitem__,
            key="lang",
            horizontal=True,
        )
    except (StreamlitDuplicateElementKey, StreamlitDuplicateElementId):
        pass
    return get_lang()

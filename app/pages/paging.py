"""Leak 2, KV memory rented out as banquet halls: contiguous and paged KV side by side.

Two engines of the session, equal but for the KV layout, on the same workload and the same
KV budget: each shows its physical block map first, then useful KV %, held-but-unwritten
slots, free total next to the largest free run (external fragmentation) and how many
requests run at once; the selected request's page table (logical block -> physical block)
sits underneath, and the legend and the request picker below the maps. Once a run is done,
its map shows the step it held the most requests at (its last step's map is empty): the
picture stop 4's reveal stands beside.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import streamlit as st  # noqa: E402

from app.classplan import page_variants  # noqa: E402
from app.components.kvmap import (  # noqa: E402
    fork_lines,
    kv_grid_html,
    kv_stats,
    legend_html,
    page_table,
    prefix_line,
    waits_on_fragmentation,
)
from app.components.seats import reason_text  # noqa: E402
from app.i18n import t  # noqa: E402
from app.live import (  # noqa: E402
    compare_row,
    kept_select,
    live_page,
    runs_for,
    side_by_side,
    step_header,
)
from app.state import Run, Session  # noqa: E402
from engine.config import KV_LAYOUTS as LAYOUTS  # noqa: E402

SELECTED = "kv_selected"


def _pick_request(runs: list[Run]) -> str | None:
    options: list[str] = []
    for run in runs:
        if run.last:
            options += [r for r in run.last["kv"]["block_tables"] if r not in options]
    options.sort(key=lambda r: (len(r), r))
    return kept_select(SELECTED, options, label=t("paging.select"), help=t("paging.select.help"))


def fullest(run: Run) -> dict | None:
    """The step of a finished run whose KV held the most requests (the earliest of equals):
    what the page shows once every request is done, since the last step's map is empty."""
    if not run.done or not run.history:
        return None
    return max(run.history, key=lambda r: (len(r["kv"]["block_tables"]), -r["step"]))


def draw_run(run: Run, selected: str | None) -> None:
    last = run.last
    if last is None:
        st.info(t("live.press_step", n=len(run.names)))
        return
    if (peak := fullest(run)) is not None:  # done: the map at its fullest, which says it
        st.caption(t("paging.fullest", step=peak["step"], n=len(peak["kv"]["block_tables"])))
        last = peak
    kv = last["kv"]
    s = kv_stats(kv)
    st.html(kv_grid_html(kv, selected))  # the picture first: on a projector it is on screen
    a, b, c = st.columns(3)
    # named for what they count: held slots holding tokens, and held slots holding none
    # (reservation waste when contiguous, the last block's internal waste when paged)
    a.metric(t("paging.useful_held"), f"{100 * s['useful_frac']:.0f}%",
             help=t("paging.useful_held.help"))
    b.metric(t("paging.held_unwritten"), s["waste"],
             help=t("paging.held_unwritten.help"))
    c.metric(t("paging.concurrency"), s["requests"], help=t("paging.concurrency.help"))
    d, e, f = st.columns(3)
    d.metric(t("paging.free"), s["free"])
    e.metric(t("paging.largest_run"), s["largest_free_run"],
             help=t("paging.largest_run.help"))
    f.metric(t("paging.shared"), s["shared_blocks"], help=t("paging.shared.help"))
    for line in fork_lines(kv):  # n > 1 samples: what they share, and what was copied
        st.markdown(line)
    if last.get("prefix"):  # prefix caching, explained: folded, the page table stays in view
        with st.expander(t("prefix.header", n=len(last["prefix"]))):
            for rid, lookup in last["prefix"].items():
                st.caption(prefix_line(rid, lookup))
    if waits_on_fragmentation(last):
        st.warning(t("paging.frag_wait", free=s["free"], run=s["largest_free_run"],
                     reason=last["blocked_reason"]))
    elif last.get("blocked_reason") and last["waiting"]:
        st.caption(f"{t('seats.blocked')}: {reason_text(last['blocked_reason'])}")
    if selected and selected in kv["block_tables"]:
        st.markdown(f"**{t('paging.page_table', rid=selected)}**")
        table = page_table(kv, selected)
        st.dataframe(table, hide_index=True, width="stretch",
                     height=min(260, 36 * (len(table) + 1) + 4))
    elif selected:
        st.caption(t("paging.not_running", rid=selected))


def draw(session: Session) -> list[Run]:
    s = session.settings
    runs = runs_for(session, page_variants("paging", s))
    step_header(runs)
    first = runs[0].engine.config
    st.caption(t("paging.budget", blocks=s.num_blocks, bs=s.block_size,
                 slots=s.num_blocks * s.block_size, mml=first.max_model_len,
                 per=first.blocks_per_seq))
    # the maps above, then their legend and the request whose page table shows: the
    # selection is read first, since the maps outline that request's blocks
    maps = st.container()
    st.html(legend_html())
    selected = _pick_request(runs)
    with maps:
        side_by_side("kv_layout", LAYOUTS, s.kv_layout, runs,
                     lambda run: draw_run(run, selected))
    if any(r.history for r in runs):
        compare_row("kv_layout", LAYOUTS, runs, ("kv_used", "seats_busy"))
    return runs


live_page("paging", draw)

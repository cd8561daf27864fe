"""Colours the live views share: one per request (stable across steps and pages) and per state.

A request id "r7" always gets colour 7 of the palette, so the same rider has the same colour
in the seats, the KV map, the timeline and the speculation strips.
"""

from __future__ import annotations

import re

# Tableau 20, darker half first: readable on a projector, distinct in neighbouring cells.
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
    "#bcbd22", "#7f7f7f", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94",
    "#f7b6d2", "#9edae5", "#dbdb8d", "#393b79",
)

# seat / cell states
STATE_COLORS = {
    "running": "#2e9e4f",  # generating
    "prefill": "#3b82c4",  # computing its prompt
    "idle-finished": "#c8c8c8",  # done, still holding its seat (static batching)
    "empty": "#ffffff",
    "wasted": "#e4572e",  # a seat-step computed for nobody
}
SPEC_COLORS = {
    "accepted": "#2e9e4f",
    "rejected": "#d62728",
    "discarded": "#f2b8b5",  # drafted after a rejection: thrown away unexamined
    "correction": "#1f6fd1",
    "bonus": "#1f6fd1",
}

_NUM = re.compile(r"(\d+)$")


def request_color(request_id: str | None) -> str:
    """The request's colour; ids without a trailing number get one by a stable hash."""
    if not request_id:
        return "#ffffff"
    m = _NUM.search(request_id)
    n = int(m.group(1)) if m else sum(map(ord, request_id))
    return PALETTE[n % len(PALETTE)]


def text_color(background: str) -> str:
    """Black or white, whichever reads better on `background` ("#rrggbb")."""
    r, g, b = (int(background[i:i + 2], 16) for i in (1, 3, 5))
    return "#000000" if 0.299 * r + 0.587 * g + 0.114 * b > 150 else "#ffffff"

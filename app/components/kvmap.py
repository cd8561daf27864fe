"""Leak 2 drawn: the physical KV block map, one request's page table, and the waste totals.

Pure functions of a StepReport's `kv` dict. In the map each cell is one physical block:
coloured by its owner and filled from the bottom as far as its slots hold real tokens;
reserved-but-unwritten blocks are hatched, free blocks blank, blocks shared by several
requests framed in black with their reference count, cached blocks (no owner, content kept
for a later prefix hit) dotted grey. The n > 1 samples of one request (`<id>#<i>`) hold its
prompt's blocks by reference after their fork; a block copied on write this step (a sample
wrote into a block its siblings still held) is framed in red with its source block. Request ids in HTML go through `html.escape`.
"""

from __future__ import annotations

import html

import pandas as pd

from app.components.palette import request_color
from app.i18n import t

COLUMNS = 16  # cells per row of the map

# A block's number and its share badge shrink with the cell (container query units), so in
# a narrow map they stay inside their own cell instead of running into the next one.
CSS = """
<style>
.sl-kv{display:grid;gap:4px;}
.sl-b{height:40px;border:1px solid #777;border-radius:4px;position:relative;font-size:11px;
 box-sizing:border-box;overflow:hidden;container-type:inline-size;}
.sl-b span{position:absolute;left:2px;top:1px;color:#222;text-shadow:0 0 2px #fff;
 font-size:min(11px,32cqw);white-space:nowrap;line-height:1.1;}
.sl-b.free{background:#fff;border:1px dashed #bbb;}
.sl-b.free span{color:#aaa;text-shadow:none;}
.sl-b.cached{background:#fff;border:2px dotted #888;}
.sl-b.shared{border:3px solid #000;}
.sl-b.copied{border:3px solid #d62728;}
.sl-b i.cow{position:absolute;right:1px;top:1px;font-size:min(11px,30cqw);font-style:normal;
 background:#d62728;color:#fff;border-radius:3px;padding:0 2px;white-space:nowrap;line-height:1.1;}
.sl-b.sel{outline:4px solid #ffd400;outline-offset:1px;z-index:1;}
.sl-b b{position:absolute;right:1px;bottom:1px;font-size:min(13px,34cqw);background:#000;
 color:#fff;border-radius:3px;padding:0 2px;white-space:nowrap;line-height:1.1;}
.sl-legend{display:flex;flex-wrap:wrap;gap:14px;font-size:15px;margin-top:8px;align-items:center;}
.sl-legend i{display:inline-block;width:22px;height:16px;border:1px solid #777;margin-right:5px;
 vertical-align:middle;border-radius:3px;}
</style>
"""


def _fill(color: str, frac: float) -> str:
    """Owner colour up to `frac` of the height, its pale tint above (allocated, not written)."""
    pct = round(100 * frac)
    return f"background:linear-gradient(to top,{color} {pct}%,{color}33 {pct}%);"


def _hatch(color: str) -> str:
    return f"background:repeating-linear-gradient(45deg,{color}66 0 5px,#fff 5px 10px);"


def block_title(block: dict, block_size: int, copied_from: int | None = None) -> str:
    owners = ", ".join(block["owners"]) or "-"
    state = t(f"kv.state.{block['state']}")
    refs = f" · {t('kv.refs', n=len(block['owners']))}" if len(block["owners"]) > 1 else ""
    cow = f" · {t('kv.copied_from', src=copied_from)}" if copied_from is not None else ""
    return f"#{block['block']} · {owners} · {block['tokens']}/{block_size} · {state}{refs}{cow}"


def copied_into(kv: dict) -> dict[int, int]:
    """This step's copy-on-write: destination block -> the shared block it was copied from."""
    return {int(dst): int(src) for src, dst in kv.get("copies") or []}


def forked_groups(kv: dict) -> dict[str, list[str]]:
    """The n > 1 requests on the map: the client's id -> its samples' ids (`<id>#<i>`)."""
    groups: dict[str, list[str]] = {}
    for rid in kv["block_tables"]:
        base, sep, index = rid.rpartition("#")
        if sep and base and index.isdigit():
            groups.setdefault(base, []).append(rid)
    return {g: sorted(ids, key=lambda r: int(r.rpartition("#")[2]))
            for g, ids in groups.items() if len(ids) > 1}


def fork_lines(kv: dict) -> list[str]:
    """One line per forked request: its samples, the blocks they still share (with their
    reference counts), and the blocks copied on write this step."""
    copies = copied_into(kv)
    blocks = {b["block"]: b for b in kv["blocks"]}
    lines = []
    for group, ids in forked_groups(kv).items():
        mine = set(ids)
        shared = [b for b in kv["blocks"] if len(mine.intersection(b["owners"])) > 1]
        shared_txt = ", ".join(f"#{b['block']}×{len(b['owners'])}" for b in shared) or "-"
        cow = [f"#{src} → #{dst} ({', '.join(blocks.get(dst, {}).get('owners', [])) or '-'})"
               for dst, src in copies.items()
               if mine.intersection(blocks.get(dst, {}).get("owners", []))]
        line = t("kv.fork.line", rid=group, n=len(ids), samples=", ".join(ids),
                 shared=shared_txt)
        if cow:
            line += " " + t("kv.fork.copied", copies="; ".join(cow))
        lines.append(line)
    return lines


MAX_CELLS = 4096  # a page draws at most this many blocks; a larger pool shows its first ones


def kv_grid_html(kv: dict, selected: str | None = None, columns: int = COLUMNS) -> str:
    """The physical block map as a grid of cells; `selected`'s blocks are outlined."""
    bs = kv["block_size"]
    cells = []
    listed = {b["block"]: b for b in kv["blocks"]}  # the report lists blocks not free
    copies = copied_into(kv)
    for i in range(min(kv["num_blocks"], MAX_CELLS)):
        block = listed.get(i) or {"block": i, "state": "free", "owners": [], "tokens": 0}
        state, owners = block["state"], block["owners"]
        classes = ["sl-b", html.escape(state)]
        style = ""
        if owners:
            color = request_color(owners[0])
            style = _hatch(color) if state == "reserved" else _fill(color, block["tokens"] / bs)
        if selected is not None and selected in owners:
            classes.append("sel")
        badge = f"<b>×{len(owners)}</b>" if len(owners) > 1 else ""
        src = copies.get(i)
        if src is not None:
            classes.append("copied")
            badge += f'<i class="cow">⧉{src}</i>'
        title = html.escape(block_title(block, bs, src), quote=True)
        cells.append(f'<div class="{" ".join(classes)}" style="{style}" title="{title}">'
                     f"<span>{block['block']}</span>{badge}</div>")
    grid = (f'<div class="sl-kv" style="grid-template-columns:repeat({columns},minmax(0,1fr))">'
            f'{"".join(cells)}</div>')
    return CSS + grid


def legend_html() -> str:
    c = "#1f77b4"
    items = [
        (_fill(c, 1.0), t("kv.legend.used")),
        (_fill(c, 0.4), t("kv.legend.partial")),
        (_hatch(c), t("kv.legend.reserved")),
        ("background:#fff;border:1px dashed #bbb;", t("kv.legend.free")),
        (_fill(c, 1.0) + "border:3px solid #000;", t("kv.legend.shared")),
        ("background:#fff;border:2px dotted #888;", t("kv.legend.cached")),
        (_fill(c, 0.4) + "border:3px solid #d62728;", t("kv.legend.copied")),
    ]
    spans = "".join(f'<span><i style="{s}"></i>{html.escape(label)}</span>' for s, label in items)
    return f'{CSS}<div class="sl-legend">{spans}</div>'


def page_table(kv: dict, request_id: str) -> pd.DataFrame:
    """One request's block table: logical block -> physical block, tokens held, shared with."""
    blocks = {b["block"]: b for b in kv["blocks"]}
    rows = []
    for logical, physical in enumerate(kv["block_tables"].get(request_id, [])):
        b = blocks.get(physical, {"tokens": 0, "owners": [], "state": "?"})
        others = [o for o in b["owners"] if o != request_id]
        rows.append({
            t("kv.col.logical"): logical,
            t("kv.col.physical"): physical,
            t("kv.col.tokens"): f"{b['tokens']}/{kv['block_size']}",
            t("kv.col.state"): t(f"kv.state.{b['state']}"),
            t("kv.col.shared_with"): ", ".join(others),
        })
    return pd.DataFrame(rows)


def waits_on_fragmentation(report: dict) -> bool:
    """The head of the queue waits because no free run fits its contiguous reservation,
    though the free total would (the engine's blocked_reason says "external fragmentation")."""
    reason = report.get("blocked_reason") or ""
    return bool(report.get("waiting")) and reason.startswith("external fragmentation")


def kv_stats(kv: dict) -> dict:
    """The totals the paging page prints, in slots (tokens) and fractions."""
    bs = kv["block_size"]
    total = kv["total_slots"]
    return {
        "used": kv["used_slots"],
        "allocated": kv["allocated_slots"],
        "waste": kv["internal_waste_slots"],
        "free": kv["free_slots"],
        "largest_free_run": kv["largest_free_run"] * bs,
        "total": total,
        "useful_frac": kv["useful_frac"],
        "used_of_total": kv["used_slots"] / total if total else 0.0,
        "external_frag": kv["external_frag"],
        "requests": len(kv["block_tables"]),
        "shared_blocks": sum(1 for b in kv["blocks"] if len(b["owners"]) > 1),
    }


def prefix_line(rid: str, lookup: dict) -> str:
    """A request's prefix-cache lookup at admission (StepReport.prefix): how many of its full
    prompt blocks came from the cache, and why the first miss missed, in the page's language."""
    miss = lookup["miss"]
    why = t(f"prefix.why.{miss['why']}", token=miss["token"], left=miss.get("left", 0))
    return t("prefix.line", rid=rid, hit=lookup["hit_blocks"], full=lookup["full_blocks"],
             why=why)

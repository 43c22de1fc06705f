"""Workflows drawn: a task with its parents above and its dependants below, and a batch's
members above its callback, as boxes and curves for server-rendered SVG (the templates
draw them; every box of a task links to its page). Tiers of at most three boxes a row, so
the drawing keeps its labels legible at a phone's width."""

from __future__ import annotations

from typing import Any

WIDTH = 480
NODE_W, NODE_H = 144, 40
GAP_X, GAP_Y, MARGIN = 12, 28, 8
PER_ROW = 3
# Fill and outline per state; a box whose task has no row any more is outlined only.
STATE_COLOURS = {
    "running": ("#e3f2fd", "#1565c0"),
    "pending": ("#f6f8fa", "#5f6b76"),
    "scheduled": ("#f6f8fa", "#5f6b76"),
    "retrying": ("#fff4e5", "#ef6c00"),
    "waiting": ("#ffffff", "#8a96a3"),
    "succeeded": ("#e8f5e9", "#2e7d32"),
    "failed": ("#fdecea", "#c62828"),
    "cancelled": ("#eeeeee", "#616161"),
    "expired": ("#fff4e5", "#ef6c00"),
    "gone": ("#ffffff", "#8a96a3"),
    "not yet": ("#ffffff", "#8a96a3"),
}


def _node(
    x: float, y: float, label: str, sub: str, state: str, href: str | None, here: bool = False
) -> dict[str, Any]:
    fill, stroke = STATE_COLOURS.get(state, STATE_COLOURS["gone"])
    return {
        "x": round(x, 1),
        "y": round(y, 1),
        "w": NODE_W,
        "h": NODE_H,
        "label": label,
        "sub": sub if len(sub) <= 22 else sub[:21] + "…",
        "state": state,
        "fill": fill,
        "stroke": stroke,
        "dashed": state in ("waiting", "gone", "not yet"),
        "href": href,
        "here": here,
        "cx": round(x + NODE_W / 2, 1),
    }


def _tier(items: list[dict[str, Any]], top: float) -> tuple[list[dict[str, Any]], float]:
    """Boxes for `items` (label, sub, state, href) in centred rows from `top`; the y below."""
    nodes = []
    y = top
    for start in range(0, len(items), PER_ROW):
        row = items[start : start + PER_ROW]
        width = len(row) * NODE_W + (len(row) - 1) * GAP_X
        x = (WIDTH - width) / 2
        for item in row:
            nodes.append(_node(x, y, **item))
            x += NODE_W + GAP_X
        y += NODE_H + GAP_Y / 2
    return nodes, y - GAP_Y / 2


def _edge(upper: dict[str, Any], lower: dict[str, Any]) -> str:
    x1, y1 = upper["cx"], upper["y"] + NODE_H
    x2, y2 = lower["cx"], lower["y"]
    middle = (y1 + y2) / 2
    return f"M{x1},{y1} C{x1},{middle} {x2},{middle} {x2},{y2}"


def _task_item(row: dict[str, Any], base: str) -> dict[str, Any]:
    return {
        "label": f"#{row['id']}",
        "sub": row.get("task_type") or "",
        "state": row["state"],
        "href": f"{base}/tasks/{row['id']}",
    }


def task_graph(
    task: dict[str, Any], neighbours: list[dict[str, Any]], base: str
) -> dict[str, Any] | None:
    """The task (its id, type, state) between its parents and its dependants."""
    parents = [_task_item(n, base) for n in neighbours if n["side"] == "parent"]
    dependants = [_task_item(n, base) for n in neighbours if n["side"] == "dependant"]
    if not parents and not dependants:
        return None
    top = float(MARGIN)
    upper, y = _tier(parents, top)
    if upper:
        y += GAP_Y
    here = {
        "label": f"#{task['id']} (this task)",
        "sub": task.get("task_type") or "",
        "state": task["state"],
        "href": None,
        "here": True,
    }
    middle, y = _tier([here], y)
    lower: list[dict[str, Any]] = []
    if dependants:
        lower, y = _tier(dependants, y + GAP_Y)
    centre = middle[0]
    edges = [_edge(p, centre) for p in upper] + [_edge(centre, d) for d in lower]
    return {
        "nodes": upper + middle + lower,
        "edges": edges,
        "width": WIDTH,
        "height": round(y + MARGIN, 1),
    }


def batch_graph(batch: dict[str, Any], base: str) -> dict[str, Any]:
    """The batch's members that still have a row above its callback (or where the
    callback will be, and after how many more)."""
    members = [_task_item(m, base) for m in batch["members"]]
    upper, y = _tier(members, float(MARGIN))
    ended = sum(batch[k] for k in ("succeeded", "failed", "cancelled", "expired"))
    if batch["callback_id"] is not None:
        state = batch["callback_state"] or ("succeeded" if batch["callback_kept"] else "gone")
        callback = {
            "label": f"callback #{batch['callback_id']}",
            "sub": batch["callback_type"],
            "state": state,
            "href": f"{base}/tasks/{batch['callback_id']}",
        }
    else:
        left = max(batch["total"] - ended, 0)
        callback = {
            "label": f"callback, after {left} more",
            "sub": batch["callback_type"],
            "state": "not yet",
            "href": None,
        }
    lower, y = _tier([callback], y + GAP_Y if upper else y)
    edges = [_edge(m, lower[0]) for m in upper]
    return {
        "nodes": upper + lower,
        "edges": edges,
        "width": WIDTH,
        "height": round(y + MARGIN, 1),
    }

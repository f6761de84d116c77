"""Drawing a run's curves (:func:`spotwise.engine.run.curves.curves`) for ``spotwise status JOB --plot``.

Two panels, one figure: the loss against the step, and the spend against time with the budget as a
dashed line; preemptions, lost nodes, market moves, migrations and budget stops are marked on both
(a vertical line at the step reached then, and at the time). matplotlib with the Agg backend: no
screen needed. :func:`series` is what gets drawn, so a test can check the plotted data without
reading pixels back.
"""

from __future__ import annotations

from typing import Any


def series(c: dict[str, Any]) -> dict[str, Any]:
    """The plotted data: ``loss`` ((step, loss) pairs, points without either left out), ``eval_loss``
    (the held-out losses' (step, loss)), ``spend``
    ((minutes since the first point, USD)), ``budget_usd``, and the marks on each panel."""
    pts = c["points"]
    t0 = pts[0]["t"] if pts else 0.0
    return {
        "loss": [(p["step"], p["loss"]) for p in pts if p["step"] is not None and p["loss"] is not None],
        "eval_loss": [(e["step"], e["loss"]) for e in c.get("eval_loss") or [] if e.get("loss") is not None],
        "spend": [((p["t"] - t0) / 60.0, p["spend_usd"]) for p in pts],
        "budget_usd": c.get("budget_usd"),
        "loss_marks": [(m["step"], m["label"]) for m in c["marks"] if m["step"] is not None],
        "spend_marks": [((m["t"] - t0) / 60.0, m["label"]) for m in c["marks"] if pts],
    }


def plot_curves(c: dict[str, Any], path: str) -> dict[str, Any]:
    """Write the figure to ``path`` (.png, .svg or .pdf, by its suffix); returns :func:`series`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = series(c)
    fig, (ax_loss, ax_spend) = plt.subplots(1, 2, figsize=(11, 4.2))
    if s["loss"]:
        ax_loss.plot([x for x, _ in s["loss"]], [y for _, y in s["loss"]], color="#0969da", label="loss")
    if s["eval_loss"]:
        ax_loss.plot([x for x, _ in s["eval_loss"]], [y for _, y in s["eval_loss"]], color="#cf222e", marker="o",
                     markersize=3, label="held-out loss")
    if not s["loss"] and not s["eval_loss"]:
        ax_loss.text(0.5, 0.5, "no loss reported yet", ha="center", va="center", transform=ax_loss.transAxes)
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("training loss (rank 0)")
    ax_loss.set_title("loss")
    if s["spend"]:
        ax_spend.plot([x for x, _ in s["spend"]], [y for _, y in s["spend"]], color="#1a7f37", label="spend")
    if s["budget_usd"]:
        ax_spend.axhline(s["budget_usd"], color="#cf222e", linestyle="--", label=f"budget ${s['budget_usd']:.2f}")
    ax_spend.set_xlabel("minutes since the first sample")
    ax_spend.set_ylabel("USD")
    ax_spend.set_title("spend")
    colours = {"preempted": "#bf8700", "node lost": "#8250df"}
    seen: set[tuple[str, int]] = set()
    for (x, label), ax in [*((m, ax_loss) for m in s["loss_marks"]), *((m, ax_spend) for m in s["spend_marks"])]:
        ax.axvline(x, color=colours.get(label, "#57606a"), linestyle=":", linewidth=1,
                   label=label if (label, id(ax)) not in seen else None)
        seen.add((label, id(ax)))
    for ax in (ax_loss, ax_spend):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(f"job {c['job_id']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return s

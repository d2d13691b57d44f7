"""The sweep's PNG. matplotlib is imported here only, and through the Agg canvas rather than pyplot,
so ``run`` never pays for it, no display is needed and no global figure state is left behind."""

from __future__ import annotations

from .report import SweepReport

__all__ = ["plot_sweep"]


def plot_sweep(report: SweepReport, path: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    pts = sorted(report.points, key=lambda p: p.rate)
    rates = [p.rate for p in pts]
    fig = Figure(figsize=(8, 8))
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    ax1.plot(rates, rates, linestyle=":", color="grey", label="offered (target)")
    ax1.plot(rates, [p.accepted_per_s for p in pts], marker="o", label="accepted/s")
    ax1.plot(rates, [p.delivered_per_s for p in pts], marker="s", label="delivered/s (during load)")
    ax1.set_ylabel("messages / s")
    ax1.set_title("upf-loadgen sweep")
    ax1.grid(True, alpha=0.3)
    for name in ("p50_ms", "p90_ms", "p95_ms", "p99_ms", "max_ms"):
        ax2.plot(rates, [max(getattr(p, name), 0.001) for p in pts], marker=".", label=name[:-3])
    ax2.axhline(report.p99_bound_ms, linestyle="--", color="red", alpha=0.5, label="p99 bound")
    ax2.set_yscale("log")
    ax2.set_ylabel("send -> receive latency (ms)")
    ax2.set_xlabel("offered rate (publishes / s)")
    ax2.grid(True, which="both", alpha=0.3)
    if report.knee is not None:
        ax1.axvline(report.knee.rate, color="red", alpha=0.4, label="knee")
        ax2.axvline(report.knee.rate, color="red", alpha=0.4, label="knee")
    ax1.legend(loc="upper left")
    ax2.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)

"""sweep: ``upf-loadgen sweep`` against one UPF shape: the knee, a PNG, and the servers' CPU per
accepted publish / per delivered message at every step."""

from __future__ import annotations

import itertools
from pathlib import Path

import msgspec
from harness import REPO, LoadgenRun, Shape, lg_common, log, price_run, summarize_run
from schema import Config, Knee, RunSummary, Sweep


def phase_sweep(kind: str, cfg: Config, work: Path, out: Path, n: int = 1) -> Sweep:
    shape = Shape(kind, work)
    try:
        idle_rss = shape.rss_kb()
        rates = ",".join(str(r) for r in cfg.sweep_rates)
        png = out / f"sweep-{kind}-{n}.png"
        argv = [
            "sweep",
            *lg_common(shape, cfg.lg_topics, cfg.sweep_secs),
            "--rates",
            rates,
            "--pause",
            "1",
            "--plot",
            str(png),
        ]
        lg = LoadgenRun(argv, shape)
        rep = lg.wait(timeout=len(cfg.sweep_rates) * (cfg.sweep_secs + 90) + 60)
        shape.check_alive()
        if png.exists():
            shrink_png(png)
        marks = [i for i, e in enumerate(lg.events) if e["kind"] in ("step", "point")]
        windows = []  # (step event index, point event index) per completed step
        for i, j in itertools.pairwise(marks):
            if lg.events[i]["kind"] == "step" and lg.events[j]["kind"] == "point":
                windows.append((i, j))
        rows: list[RunSummary] = []
        for step, run in enumerate(rep.get("runs", [])):
            s = summarize_run(run, RunSummary)
            if step < len(windows):
                i, j = windows[step]
                cpu = {k: lg.events[j]["cpu"][k] - lg.events[i]["cpu"][k] for k in lg.events[i]["cpu"]}
                price_run(s, lg.events[i : j + 1], cpu)
                s.rss_kb = lg.events[j]["rss_kb"]
            rows.append(s)
        return Sweep(
            shape=kind,
            rates=cfg.sweep_rates,
            knee=msgspec.convert(rep["knee"], Knee) if rep.get("knee") else None,
            p99_bound_ms=rep.get("p99_bound_ms"),
            tolerance=rep.get("tolerance"),
            exit_code=rep.get("exit_code"),
            plot=(str(png.relative_to(REPO)) if png.is_relative_to(REPO) else str(png)) if png.exists() else "",
            idle_rss_kb=idle_rss,
            end_rss_kb=shape.rss_kb(),
            peak_rss_kb=shape.rss_kb("VmHWM:"),
            steps=rows,
        )
    finally:
        shape.stop()


def shrink_png(path: Path) -> None:
    """loadgen's plot is an 800x800 RGBA PNG of ~100 KB; a 64-colour palette keeps it legible at ~25 KB,
    small enough to commit. Best effort: left as it is without Pillow."""
    try:
        from PIL import Image

        with Image.open(path) as im:
            q = im.convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT)
        q.save(path, optimize=True)
    except Exception as exc:
        log(f"could not shrink {path}: {exc}")

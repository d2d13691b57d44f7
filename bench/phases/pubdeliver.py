"""pubdeliver: CPU of all roles together per publish-and-delivery at a fixed rate, one ws subscriber per
topic, for each shape; per-thread and per-worker CPU show where it goes."""

from __future__ import annotations

from pathlib import Path

from harness import LoadgenRun, Shape, lg_common, log, price_run, summarize_run
from schema import Config, PubDeliver, PubDeliverRun


def phase_pubdeliver(cfg: Config, work: Path) -> PubDeliver:
    out = PubDeliver(rate=cfg.pd_rate, topics=cfg.pd_topics, secs=cfg.pd_secs, shapes={})
    for kind in cfg.pd_shapes:
        shape = Shape(kind, work)
        try:
            argv = ["run", *lg_common(shape, cfg.pd_topics, cfg.pd_secs), "--rate", str(cfg.pd_rate)]
            th0, wk0 = shape.thread_cpu(), shape.worker_cpu()
            lg = LoadgenRun(argv, shape)
            rep = lg.wait(timeout=cfg.pd_secs + 180)
            th1, wk1 = shape.thread_cpu(), shape.worker_cpu()
            shape.check_alive()
            s = summarize_run(rep, PubDeliverRun)
            price_run(s, lg.events, {k: lg.cpu1[k] - lg.cpu0[k] for k in lg.cpu0})
            st = s.steady
            both = min(st.accepted, st.delivered) if st else 0
            s.cpu_us_per_publish_and_delivery = (
                round(1e6 * sum(st.server_cpu_secs.values()) / both, 1) if st and both else None
            )
            threads = {k: round(th1[k] - th0.get(k, 0.0), 3) for k in th1 if th1[k] - th0.get(k, 0.0) > 0.005}
            s.thread_cpu_secs_whole_run = dict(sorted(threads.items(), key=lambda kv: -kv[1]))
            if len(wk0) == len(wk1) and wk1:
                s.worker_cpu_secs_whole_run = [round(b - a, 3) for a, b in zip(wk0, wk1, strict=True)]
            out.shapes[kind] = s
            log(
                f"  {kind} at {cfg.pd_rate}/s: {s.verdict}, delivered {s.delivered}/{s.expected}, "
                f"{s.cpu_us_per_publish_and_delivery} us per publish-and-delivery (steady)"
            )
        finally:
            shape.stop()
    return out

"""topics: publish CPU per publish at 1,000 vs 100,000 distinct topics: one store pre-populated with one
message on each topic, no subscribers held (no pusher runs), the writer driven by bench/pubdrive.py,
the two topic counts alternating on the same writer."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import procs
from harness import BENCH, SERVER_CPUS, log, pubdrive, run_to_end
from procs import PY, tree_rss_kb
from report import med
from schema import Config, Topics, TopicsRound


def phase_topics(cfg: Config, work: Path) -> Topics:
    d = Path(tempfile.mkdtemp(prefix="topics-", dir=work))
    store = d / "upf.db"
    t0 = time.monotonic()
    r = run_to_end(
        [
            PY,
            str(BENCH / "prepopulate.py"),
            "--store",
            str(store),
            "--topics",
            str(cfg.topics_large),
            "--prefix",
            "upTOPIC",
        ],
        timeout=600,
    )
    if r.returncode != 0:
        raise RuntimeError(f"prepopulate failed: {r.stderr[-2000:]}")
    prepop_secs = time.monotonic() - t0
    store_mb = sum(f.stat().st_size for f in d.glob("upf.db*")) / 1e6
    w, port = procs.start_upf_writer(d, store, SERVER_CPUS)
    url = f"http://127.0.0.1:{port}"
    rounds: list[TopicsRound] = []
    try:
        # one short warm-up window so the first measured window is not the one paying for imports
        pubdrive(url, [w.pid], secs=1.0, conns=cfg.ingest_conns, topics=cfg.topics_small, prefix="upTOPIC")
        for n in range(cfg.topics_rounds):
            order = ("small", "large") if n % 2 == 0 else ("large", "small")
            row = {
                which: pubdrive(
                    url,
                    [w.pid],
                    secs=cfg.topics_secs,
                    conns=cfg.ingest_conns,
                    topics=cfg.topics_small if which == "small" else cfg.topics_large,
                    prefix="upTOPIC",
                )
                for which in order
            }
            rounds.append(TopicsRound(small=row["small"], large=row["large"]))
            log(
                f"topics round {n + 1}: {cfg.topics_small} topics {row['small'].cpu_us_per_publish} us/publish, "
                f"{cfg.topics_large} topics {row['large'].cpu_us_per_publish} us/publish"
            )
        rss = tree_rss_kb([w.pid])
    finally:
        w.stop()
        shutil.rmtree(d, ignore_errors=True)
    small = med([x.small.cpu_us_per_publish for x in rounds])
    large = med([x.large.cpu_us_per_publish for x in rounds])
    return Topics(
        small_topics=cfg.topics_small,
        large_topics=cfg.topics_large,
        prepopulated_topics=cfg.topics_large,
        prepopulate_secs=round(prepop_secs, 1),
        store_mb_before=round(store_mb, 1),
        subscribers_held=False,
        writer_rss_kb_end=rss,
        rounds=rounds,
        small_cpu_us_per_publish=small,
        large_cpu_us_per_publish=large,
        small_ok_per_s=med([x.small.ok_per_s for x in rounds]),
        large_ok_per_s=med([x.large.ok_per_s for x in rounds]),
        ratio_large_over_small=round(large / small, 3) if small else None,
    )

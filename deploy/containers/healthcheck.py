"""Container HEALTHCHECK for a UPF role: exit 0 when GET /__lbheartbeat__ on this process answers 200.

/__lbheartbeat__ says only "the process is up and serving" (it does not touch the database), which is what a
restart decision needs; /__heartbeat__ also checks the store and is for dashboards. The port comes from
UPF_BIND, the same setting the role listens on. Standard library only: the slim image has no curl.
"""

from __future__ import annotations

import os
import sys
import urllib.request


def probe_url(bind: str) -> str:
    host, _, port = bind.rpartition(":")
    host = host.strip("[]")
    # A wildcard bind is reachable on loopback; a specific address must be probed on that address.
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/__lbheartbeat__"


def main() -> int:
    url = probe_url(os.environ.get("UPF_BIND", "0.0.0.0:8080"))
    # No proxies: an HTTP(S)_PROXY in the container's environment must not redirect a loopback probe.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=3) as response:
            return 0 if response.status == 200 else 1
    except Exception as exc:  # any failure is "unhealthy"; say why in the health log
        print(f"healthcheck: {url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

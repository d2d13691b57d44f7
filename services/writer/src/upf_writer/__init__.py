"""UPF writer role: ntfy-compatible publish ingest (``create_app`` in ``upf_writer.app``)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("upf-writer")
except PackageNotFoundError:  # pragma: no cover - running from a bare source tree
    __version__ = "0+unknown"

__all__ = ["__version__"]

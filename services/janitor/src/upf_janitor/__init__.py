"""UPF janitor role: TTL expiry and dead-node sweeps, talking to the others only through the store."""

from .janitor import Janitor, PassResult

__version__ = "0.1.0"
__all__ = ["Janitor", "PassResult", "__version__"]

"""upf-keyspace: the shared, versioned keyspace library of UPF.

Stable surface: everything in ``__all__``. Names with a leading underscore, and the drivers'
modules, are internal.
"""

from .contract import Database, Transaction, Watch, WatchSet
from .envelope import ENVELOPE_VERSION, Envelope, decode_envelope, encode_envelope
from .errors import FormatVersionError, StoreError, StoreOpenError, UnfinishedRestoreError
from .format import CURRENT_FORMAT, FormatVersion
from .msgid import decode_id, encode_id
from .ops.read import SINCE_ALL, SINCE_LATEST, SINCE_NONE, Since, Stored
from .settings import Settings, SettingsError, load_settings
from .store import Drained, Pokes, Published, Store, open_database, open_store
from .wire import Message, message_from_envelope

__version__ = "0.1.0"

__all__ = [
    "CURRENT_FORMAT",
    "Database",
    "Drained",
    "ENVELOPE_VERSION",
    "Envelope",
    "FormatVersion",
    "FormatVersionError",
    "UnfinishedRestoreError",
    "Message",
    "Pokes",
    "Published",
    "SINCE_ALL",
    "SINCE_LATEST",
    "SINCE_NONE",
    "Settings",
    "SettingsError",
    "Since",
    "Store",
    "StoreError",
    "StoreOpenError",
    "Stored",
    "Transaction",
    "Watch",
    "WatchSet",
    "decode_envelope",
    "decode_id",
    "encode_envelope",
    "encode_id",
    "load_settings",
    "message_from_envelope",
    "open_database",
    "open_store",
]

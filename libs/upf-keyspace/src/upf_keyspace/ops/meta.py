from __future__ import annotations

from .. import keys
from ..contract import Transaction
from ..errors import FormatVersionError, UnfinishedRestoreError
from ..format import CURRENT_FORMAT


async def check_format(tr: Transaction, restoring: bool = False) -> int:
    """Stamp an empty store with the current format; refuse one written by a newer format, and one an
    unfinished restore left (unless this is the restore: ``restoring``)."""
    if not restoring and await tr.get(keys.restoring_key()) is not None:
        raise UnfinishedRestoreError(
            "the store holds an unfinished restore (upf restore was stopped before it finished): "
            "run the same upf restore again to finish it"
        )
    raw = await tr.get(keys.format_key())
    if raw is None:
        tr.set(keys.format_key(), keys.pack_i64(CURRENT_FORMAT))
        return int(CURRENT_FORMAT)
    found = keys.unpack_i64(raw)
    if found > CURRENT_FORMAT:
        raise FormatVersionError(f"store format {found} is newer than this role's {int(CURRENT_FORMAT)}")
    return found

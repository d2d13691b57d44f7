from __future__ import annotations

from .. import keys
from ..contract import Transaction
from ..errors import FormatVersionError
from ..format import CURRENT_FORMAT


async def check_format(tr: Transaction) -> int:
    """Stamp an empty store with the current format; refuse one written by a newer format."""
    raw = await tr.get(keys.format_key())
    if raw is None:
        tr.set(keys.format_key(), keys.pack_i64(CURRENT_FORMAT))
        return int(CURRENT_FORMAT)
    found = keys.unpack_i64(raw)
    if found > CURRENT_FORMAT:
        raise FormatVersionError(f"store format {found} is newer than this role's {int(CURRENT_FORMAT)}")
    return found

"""What the embedded store creates on disk, private to the user running UPF whatever the umask.

Why: the store file holds every queued message and, with auth, password hashes and tokens; its wake
directory takes datagrams from anyone who can reach it. Files are created 0600 and directories 0700
(the store's LMDB lock file too). What exists already is left as it is.
"""

from __future__ import annotations

import os

__all__ = ["make_private_dirs", "create_private_file"]


def make_private_dirs(path: str) -> None:
    """Create directory ``path`` and its missing parents, each 0700."""
    missing: list[str] = []
    path = os.path.abspath(path)
    while not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:  # another process made it first (or it is a file: opening the store says so)
            continue
        os.chmod(directory, 0o700)  # mkdir's mode is masked by the umask


def create_private_file(path: str) -> None:
    """Create an empty file ``path`` 0600 unless it exists (LMDB takes an empty file as a new store)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except FileExistsError:
        return
    try:
        os.fchmod(fd, 0o600)  # os.open's mode is masked by the umask
    finally:
        os.close(fd)

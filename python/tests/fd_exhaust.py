"""Descriptor exhaustion for the tests' child processes (imported by the
scripts they run with ``python -c``, from this folder)."""

from __future__ import annotations

import os
import resource
from typing import List, Optional

# What exhaust() opened, kept open.
leaked: List[object] = []


def lowest_free_fd() -> int:
    fd = 0
    while True:
        try:
            os.fstat(fd)
        except OSError:
            return fd
        fd += 1


def exhaust() -> Optional[int]:
    """No new descriptor can be opened from here on: RLIMIT_NOFILE drops to
    the lowest free descriptor, as a process full of sockets would be.
    Returns the errno a further open meets (24, EMFILE)."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free_fd(), hard))
    try:
        leaked.append(open(os.devnull))
    except OSError as e:
        return e.errno
    return None

"""Numbers as people read them (shared by the progress output and report.md)."""

from __future__ import annotations


def duration(seconds: float) -> str:
    """Simulated time as people read it.

    >>> [duration(s) for s in (42, 1050, 11520, 302400)]
    ['42s', '17.5min', '3.2h', '3.5d']
    """
    if seconds < 600:
        return f"{seconds:.0f}s"
    if seconds < 3 * 3600:
        return f"{seconds / 60:.1f}min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"

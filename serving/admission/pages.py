"""Page admission: a stage starts only if free physical pages ≥ the pages its reserve needs."""
from __future__ import annotations


class PageAdmission:
    """Admit iff the reserve fits in free physical pages (exact fit admits)."""

    @staticmethod
    def can_admit(num_free_pages: int, num_reserve_pages: int) -> bool:
        return num_reserve_pages <= num_free_pages

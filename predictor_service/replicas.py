"""Which service replica holds a workflow's state: consistent hashing of workflow ids over the replicas' URLs.

A replica's history (`StageHistory`) and online correction live in its own process. Every client (each
gateway replica) hashes a workflow to the same ring of replicas, so all of a workflow's /predict and
/observe calls reach one replica, its *owner*, whichever gateway sends them. Its *backup*, the next replica
on the ring, also receives the workflow's finished stages (POST /history: history only, no trace line,
no correction update), so when the owner dies the clients fail over to the one replica that already
holds the workflow's history. A ketama ring (uhashring) moves only the dead replica's workflows.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable

from uhashring import HashRing

REPLICA_SEPARATOR = ","


def split_urls(url: str, what: str = "predictor url", replica: str = "service replica") -> tuple[str, ...]:
    """`http://a:3000,http://b:3000` → the replicas' base URLs, in the order given (duplicates dropped); `what`
    and `replica` name the option and what each URL is in the error."""
    urls = tuple(dict.fromkeys(u.strip().rstrip("/") for u in url.split(REPLICA_SEPARATOR) if u.strip()))
    bad = [u for u in urls if not u.startswith(("http://", "https://"))]
    if not urls or bad:
        raise ValueError(
            f"{what} must be http(s)://host:port, or several separated by "
            f"'{REPLICA_SEPARATOR}' (one per {replica}); got {url!r}"
        )
    return urls


class Ring:
    """The replicas in each workflow's preference order; replicas marked down are skipped until `down_s` passed."""

    def __init__(self, urls: Iterable[str], clock: Callable[[], float] = time.monotonic):
        self.urls = tuple(urls)
        self._ring = HashRing(nodes=list(self.urls))
        self._down_until: dict[str, float] = {}
        self._clock = clock

    def preference(self, workflow_id: str) -> list[str]:
        """Every replica, the workflow's owner first, then its successors on the ring."""
        if len(self.urls) == 1:
            return list(self.urls)
        return [node["nodename"] for node in self._ring.range(workflow_id)]

    def is_up(self, url: str) -> bool:
        return self._clock() >= self._down_until.get(url, 0.0)

    def live(self, workflow_id: str, skip: Collection[str] = ()) -> list[str]:
        """The workflow's replicas that are not marked down (nor in `skip`), in preference order."""
        return [u for u in self.preference(workflow_id) if u not in skip and self.is_up(u)]

    def mark_down(self, url: str, down_s: float) -> None:
        self._down_until[url] = self._clock() + down_s

    def group(self, rows: list[dict], rank: int = 0, skip: Collection[str] = ()) -> dict[str | None, list[int]]:
        """Indices of `rows` by their workflow's `rank`-th live replica (0: owner, 1: backup); None: no such one."""
        groups: dict[str | None, list[int]] = defaultdict(list)
        for i, row in enumerate(rows):
            live = self.live(str(row.get("workflow_id")), skip)
            groups[live[rank] if rank < len(live) else None].append(i)
        return dict(groups)

"""The replica ring: every client agrees on a workflow's owner, failover goes to the next replica, and losing
one replica moves only its own workflows."""

import pytest

from predictor_service.client import ClientConfig, PredictorClient
from predictor_service.replicas import Ring, split_urls

URLS = ("http://a:3000", "http://b:3000", "http://c:3000")
WORKFLOWS = [f"wf-{i}" for i in range(600)]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_clients_agree_on_owners_and_spread_workflows():
    one, other = Ring(URLS), Ring(reversed(URLS))  # the order replicas are listed in does not matter
    owners = [one.preference(w)[0] for w in WORKFLOWS]
    assert owners == [other.preference(w)[0] for w in WORKFLOWS]
    assert all(owners.count(u) > len(WORKFLOWS) / 6 for u in URLS)
    assert all(sorted(one.preference(w)) == sorted(URLS) for w in WORKFLOWS)


def test_a_replica_marked_down_hands_over_only_its_workflows_until_its_cooldown_ends():
    clock = Clock()
    ring = Ring(URLS, clock)
    before = {w: ring.live(w) for w in WORKFLOWS}
    ring.mark_down(URLS[1], 5.0)
    for w in WORKFLOWS:
        after = ring.live(w)
        assert after == [u for u in before[w] if u != URLS[1]]  # the next replica on the ring takes over
    groups = ring.group([{"workflow_id": w} for w in WORKFLOWS], rank=0)
    assert URLS[1] not in groups and sum(map(len, groups.values())) == len(WORKFLOWS)
    clock.now = 5.0
    assert {w: ring.live(w) for w in WORKFLOWS} == before


def test_backups_are_the_next_live_replica_and_none_without_one():
    ring = Ring(URLS[:2])
    rows = [{"workflow_id": w} for w in WORKFLOWS[:50]]
    owners, backups = ring.group(rows, 0), ring.group(rows, 1)
    for url in URLS[:2]:
        other = URLS[1] if url == URLS[0] else URLS[0]
        assert set(owners.get(url, [])) == set(backups.get(other, []))
    ring.mark_down(URLS[0], 60.0)
    assert set(ring.group(rows, 1)) == {None}


def test_replica_urls_are_checked():
    assert split_urls("http://a:1, http://b:2/,http://a:1") == ("http://a:1", "http://b:2")
    with pytest.raises(ValueError, match="one per service replica"):
        ClientConfig(url="http://a:1,b:2")
    with pytest.raises(ValueError, match="AsyncPredictorClient"):
        PredictorClient(ClientConfig(url="http://a:1,http://b:2"))

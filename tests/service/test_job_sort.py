"""``GET /jobs?sort=``: the service orders every matching job, page by page."""

from __future__ import annotations

import requests

from ma_jupyter.models import JobSort


def test_listing_sorts_every_job_by_a_column_across_pages(ma_client):
    names = ["mango", "apple", "kiwi", "banana", "cherry"]
    ids = [ma_client.submit(name=n, command="true", duration=1).id for n in names]
    ascending = []
    for offset in range(0, 5, 2):  # pages of two
        ascending += [j.spec.name for j in ma_client.job_page(sort="name", offset=offset, limit=2).items]
    assert ascending == sorted(names)
    assert [j.spec.name for j in ma_client.job_page(sort="-name").items] == sorted(names, reverse=True)
    # the default stays newest first; ties of a column keep newest first
    assert [j.id for j in ma_client.job_page().items] == ids[::-1]
    assert [j.id for j in ma_client.job_page(sort="-created").items] == ids[::-1]
    assert [j.id for j in ma_client.job_page(sort="created").items] == ids
    same = [j.id for j in ma_client.job_page(sort=JobSort.creator_asc).items]
    assert same == ids[::-1]  # one creator: newest first
    assert sorted(j.value for j in JobSort) == sorted(
        f"{sign}{key}"
        for key in (
            "created",
            "name",
            "id",
            "status",
            "creator",
            "outputs",
            "priority",
            "mode",
            "spec",
            "elapsed",
        )
        for sign in ("", "-")
    )


def test_an_unknown_sort_key_is_a_400_naming_the_choices(ma_client):
    reply = requests.get(
        f"{ma_client.url}/api/v1/jobs",
        params={"sort": "job; drop table jobs"},
        headers={"Authorization": f"Bearer {ma_client._token}"},
        timeout=30,
    )
    assert reply.status_code == 400, reply.text
    assert "sort" in reply.text and "-name" in reply.text


def test_the_table_view_columns_sort_in_the_service_too(ma_client):
    """Mode × nodes, spec and elapsed are read from each job's JSON, across pages as well."""
    slow = ma_client.submit(
        name="slow", command='python -c "import time; time.sleep(1.5)"', specs=["cpu.small"]
    )
    quick = ma_client.submit(name="quick", command="true", specs=["cpu.medium"])
    pair = ma_client.submit(name="pair", mode="tensorflow", nodes=2, command="true", specs=["cpu.small"])
    jobs = (slow, quick, pair)
    for job in jobs:
        job.wait(timeout=120)

    def order(sort: str) -> list[str]:
        names = []
        for offset in range(0, 3, 2):  # pages of two
            names += [j.spec.name for j in ma_client.job_page(sort=sort, offset=offset, limit=2).items]
        return names

    # single before tensorflow; two single jobs of one node each: newest first
    assert order("mode") == ["quick", "slow", "pair"]
    assert order("-mode") == ["pair", "quick", "slow"]
    # the spec each ran on
    assert order("spec")[0] == "quick" and order("-spec")[-1] == "quick"  # cpu.medium < cpu.small
    # how long each ran: the sleeping job longer than the one running `true` (the 2-node job's
    # own time depends on the machine's load: not compared)
    longest_first = order("-elapsed")
    assert longest_first.index("slow") < longest_first.index("quick"), longest_first
    shortest_first = order("elapsed")
    assert shortest_first.index("quick") < shortest_first.index("slow"), shortest_first

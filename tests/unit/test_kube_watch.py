"""A watch's stream of Nodes parsed (``kube.wire.node_watch``): events in order, the version
to go on from (bookmarks move it), 410 Gone as "list again", anything else refused."""

from __future__ import annotations

import json

import pytest

from provisioner.kube.model import KubeRejected
from provisioner.kube.wire import node_watch

# the apiserver's event for a watch from a compacted version (a Status, as kube-apiserver
# v1.31 sends it: k8s.io/apimachinery pkg/api/errors NewResourceExpired)
EXPIRED = (b'{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},'
           b'"status":"Failure","message":"too old resource version: 1 (235)",'
           b'"reason":"Expired","code":410}}')


def event(kind: str, name: str, version: str, **status: object) -> bytes:
    obj = {"kind": "Node", "metadata": {"name": name, "resourceVersion": version},
           "status": status}
    return json.dumps({"type": kind, "object": obj}).encode()


def bookmark(version: str) -> bytes:
    return json.dumps({"type": "BOOKMARK", "object": {
        "kind": "Node", "metadata": {"resourceVersion": version}}}).encode()


def test_events_in_order_and_the_last_version() -> None:
    watch = node_watch([event("ADDED", "a", "11"), b"", event("MODIFIED", "a", "12"),
                        event("DELETED", "b", "13"), bookmark("20")], "10")
    assert [(kind, info.name, info.resource_version) for kind, info in watch.events] == [
        ("ADDED", "a", "11"), ("MODIFIED", "a", "12"), ("DELETED", "b", "13")]
    assert watch.resource_version == "20" and not watch.expired


def test_an_empty_watch_goes_on_from_where_it_was() -> None:
    assert node_watch([], "10").resource_version == "10"


def test_410_gone_keeps_what_came_before_and_asks_for_a_list() -> None:
    watch = node_watch([event("MODIFIED", "a", "12"), EXPIRED, event("ADDED", "z", "99")], "10")
    assert watch.expired
    assert [info.name for _, info in watch.events] == ["a"]
    assert watch.resource_version == "12"


@pytest.mark.parametrize("line", [
    b"{not json", b'{"type": "MODIFIED"}', b'{"type": "MODIFIED", "object": []}',
    b'{"type": "MODIFIED", "object": {"metadata": {}}}',  # no name
    b'{"type": "SURPRISE", "object": {"metadata": {"name": "a"}}}',
    b'{"type": "ERROR", "object": {"code": 500, "message": "etcd is down"}}',
    b'[]',
])
def test_a_line_that_is_not_a_node_event_is_refused(line: bytes) -> None:
    with pytest.raises(KubeRejected, match="watch of nodes"):
        node_watch([event("ADDED", "a", "11"), line], "10")

"""Slurm hostlist compression: examples, errors, and round trips (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from provisioner.topology.hostlist import HostlistError, compress, compress_groups, expand


@pytest.mark.parametrize(("names", "expression"), [
    (["gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"], "gpu-node-[01-04]"),
    (["gpu-node-04", "gpu-node-01", "gpu-node-02", "gpu-node-07"], "gpu-node-[01-02,04,07]"),
    (["n8", "n9", "n10"], "n[8-10]"),
    (["n08", "n09", "n10"], "n[08-10]"),
    (["n1", "n01"], "n[1,01]"),
    (["login", "gpu1", "gpu2"], "gpu[1-2],login"),
    (["a07"], "a07"),
    (["ib-leaf-01", "ib-leaf-02", "ib-leaf-04"], "ib-leaf-[01-02,04]"),
    (["x", "x"], "x"),
])
def test_compress_examples(names: list[str], expression: str) -> None:
    assert compress(names) == expression
    assert sorted(expand(expression)) == sorted(set(names))


def test_groups_and_expansion_forms() -> None:
    assert compress_groups(["b2", "a1", "a2"]) == ["a[1-2]", "b2"]
    assert expand("rack[1-2]-n[01-02]") == ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]
    assert expand("tux[0-3,12,18-20]") == ["tux0", "tux1", "tux2", "tux3", "tux12", "tux18",
                                           "tux19", "tux20"]


@pytest.mark.parametrize("bad", ["a[1-2", "a]1", "a[[1]]", "a[x]", "a[3-1]", "a[]", "a,,b",
                                 "", " a", "a[1-2000000]"])
def test_bad_expressions(bad: str) -> None:
    with pytest.raises(HostlistError):
        expand(bad)


@pytest.mark.parametrize("bad", ["a,b", "a[1]", "a b", ""])
def test_names_that_cannot_be_compressed(bad: str) -> None:
    with pytest.raises(HostlistError):
        compress([bad])


_prefix = st.from_regex(r"[a-z][a-z0-9-]{0,6}[a-z-]", fullmatch=True)
_name = st.one_of(
    st.builds(lambda p, n, w: f"{p}{n:0{w}d}", _prefix, st.integers(0, 300), st.integers(1, 4)),
    _prefix,
    st.from_regex(r"[A-Za-z][A-Za-z0-9._-]{0,10}", fullmatch=True),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_name, max_size=40))
def test_round_trip(names: list[str]) -> None:
    expression = compress(names)
    expanded = expand(expression) if names else []
    assert sorted(expanded) == sorted(set(names))
    assert len(expanded) == len(set(expanded))
    if names:
        assert compress(expanded) == expression


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab01-[],", max_size=20))
def test_expand_never_crashes(text: str) -> None:
    try:
        names = expand(text)
    except HostlistError:
        return
    assert all(names)

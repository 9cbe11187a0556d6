"""The store against real SQLite and a real PostgreSQL server started by the test."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from provisioner.config import Settings
from provisioner.domain import BmcEndpoint, NewNode, NodeFilter, Role
from provisioner.errors import Conflict, NodeBusy, NotFound, SchemaError
from provisioner.lifecycle.states import NodeState
from provisioner.store import db
from provisioner.store.repo import NodeChange
from provisioner.store.store import Store, open_store

S = NodeState


def new(n: int, **kw: object) -> NewNode:
    values: dict[str, object] = {"state": S.ENROLLED, "hostname": f"gpu-{n:03d}",
                                 "serial": f"SN{n:04d}", "macs": (f"52:54:00:aa:00:{n:02x}",),
                                 "rack": f"r{n % 2}", "profile": "h100" if n % 3 else None}
    values.update(kw)
    return NewNode(**values)  # type: ignore[arg-type]


async def test_create_and_find_by_every_key(any_store: Store) -> None:
    node = await any_store.nodes.create(new(1), actor="test")
    for key in (node.id, "gpu-001", "SN0001", "52:54:00:AA:00:01", "5254.00aa.0001"):
        assert (await any_store.nodes.find(key)).id == node.id
    with pytest.raises(NotFound):
        await any_store.nodes.find("nope")


@pytest.mark.parametrize("clash", ["hostname", "serial", "macs"])
async def test_unique_fields_conflict(any_store: Store, clash: str) -> None:
    await any_store.nodes.create(new(1), actor="test")
    other = {"hostname": "x", "serial": "y", "macs": ("52:54:00:bb:00:01",)}
    other[clash] = getattr(new(1), clash)
    with pytest.raises(Conflict, match="mac" if clash == "macs" else clash):
        await any_store.nodes.create(new(2, **other), actor="test")
    assert (await any_store.nodes.count_by_state()) == {"enrolled": 1}


async def test_a_burst_of_enrolments_commits_together_but_a_clash_fails_alone(
        any_store: Store) -> None:
    """Enrolments waiting at once share one transaction (a boot storm's discovered nodes):
    one whose MAC is taken fails with Conflict, and only it."""
    await any_store.nodes.create(new(1), actor="test")
    clash = any_store.nodes.create(new(99, hostname="x", serial="y", macs=new(1).macs),
                                   actor="test")
    calls = [any_store.nodes.create(new(n), actor="test") for n in range(2, 30)]
    results = await asyncio.gather(*calls[:10], clash, *calls[10:], return_exceptions=True)
    assert isinstance(results[10], Conflict) and "mac" in str(results[10])
    created = [r for r in results if not isinstance(r, BaseException)]
    assert len(created) == 28, [r for r in results if isinstance(r, BaseException)]
    assert (await any_store.nodes.count_by_state()) == {"enrolled": 29}
    for node in created[:3]:
        assert (await any_store.nodes.find(node.macs[0])).id == node.id
        [entry] = await any_store.nodes.history(node.id)
        assert (entry.event, entry.to_state, entry.actor) == ("enroll", "enrolled", "test")
        assert node.version == 1 and node.history_seq == 1


async def test_list_filters_and_pagination(any_store: Store) -> None:
    for n in range(1, 11):
        await any_store.nodes.create(new(n), actor="test")
    repo = any_store.nodes
    _, total = await repo.list(NodeFilter(), limit=3, offset=0)
    assert total == 10
    pages = [await repo.list(NodeFilter(), limit=4, offset=o) for o in (0, 4, 8)]
    names = [n.hostname for page, _ in pages for n in page]
    assert names == [f"gpu-{n:03d}" for n in range(1, 11)]
    assert (await repo.list(NodeFilter(rack="r0"), limit=50, offset=0))[1] == 5
    assert (await repo.list(NodeFilter(profile="h100"), limit=50, offset=0))[1] == 7
    assert (await repo.list(NodeFilter(state="active"), limit=50, offset=0))[1] == 0
    for q, count in (("gpu-00", 9), ("SN0010", 1), ("aa:00:0a", 1), ("%", 0), ("_", 0)):
        assert (await repo.list(NodeFilter(query=q), limit=50, offset=0))[1] == count, q


async def test_transition_is_compare_and_set_with_history(any_store: Store) -> None:
    node = await any_store.nodes.create(new(1), actor="alice")
    moved = await any_store.nodes.transition(node, to_state=S.INSPECTING, event="inspect",
                                             actor="bob", reason="go")
    assert moved.state == S.INSPECTING and moved.version == node.version + 1
    with pytest.raises(NodeBusy):  # a stale copy loses
        await any_store.nodes.transition(node, to_state=S.INSPECTING, event="inspect",
                                         actor="eve")
    history = await any_store.nodes.history(node.id)
    assert [(h.seq, h.event, h.from_state, h.to_state, h.actor) for h in history] == [
        (1, "enroll", "", "enrolled", "alice"), (2, "inspect", "enrolled", "inspecting", "bob")]


async def test_checkpoint_only_while_in_that_state(any_store: Store) -> None:
    node = await any_store.nodes.create(new(1, state=S.DEPLOYING), actor="t")
    saved = await any_store.nodes.save_checkpoint(node, ["run:1", "power-on"])
    assert saved.checkpoint == ("run:1", "power-on")
    await any_store.nodes.transition(saved, to_state=S.DEPLOY_FAILED, event="abort", actor="t")
    with pytest.raises(NodeBusy):
        await any_store.nodes.save_checkpoint(saved, ["run:1", "power-on", "write-image"])


async def test_bmc_password_is_encrypted_at_rest(any_store: Store) -> None:
    bmc = BmcEndpoint(driver="ipmi", address="10.1.1.1", port=623, username="admin")
    node = await any_store.nodes.create(new(1, bmc=bmc, bmc_password="hunter2-secret"),
                                        actor="t")
    assert node.bmc is not None and node.bmc.password_set and "hunter2" not in repr(node)
    with any_store.engine.connect() as conn:
        raw = conn.execute(text("SELECT bmc_password_enc FROM node")).scalar_one()
    assert "hunter2" not in raw
    creds = await any_store.nodes.credentials(node.id)
    assert creds.password == "hunter2-secret" and "hunter2" not in repr(creds)
    await any_store.nodes.update_meta(node.id, NodeChange(bmc=bmc, bmc_password="new-pw"))
    assert (await any_store.nodes.credentials(node.id)).password == "new-pw"


async def test_a_moved_bmc_endpoint_drops_the_stored_password(any_store: Store) -> None:
    """Security (issue 23, finding 8): a password goes only to the address it was entered
    for; a move keeps it only when told (zero-touch linking, to an address it trusts)."""
    bmc = BmcEndpoint(driver="redfish", address="https://10.1.1.1", username="admin")
    node = await any_store.nodes.create(new(1, bmc=bmc, bmc_password="entered-pw"), actor="t")
    await any_store.bmc_secrets.begin(node.id, "rotating-pw")
    same = await any_store.nodes.update_meta(node.id, NodeChange(bmc=bmc))
    assert same.bmc is not None and same.bmc.password_set
    kept = BmcEndpoint(driver="redfish", address="https://10.1.1.2", username="admin")
    moved = await any_store.nodes.update_meta(node.id, NodeChange(bmc=kept,
                                                                  keep_bmc_password=True))
    assert moved.bmc is not None and moved.bmc.password_set
    evil = BmcEndpoint(driver="redfish", address="http://10.9.9.9", username="admin")
    dropped = await any_store.nodes.update_meta(node.id, NodeChange(bmc=evil))
    assert dropped.bmc is not None and not dropped.bmc.password_set
    assert (await any_store.nodes.credentials(node.id)).password is None
    assert await any_store.bmc_secrets.pending(node.id) is None
    again = await any_store.nodes.update_meta(node.id, NodeChange(bmc=bmc,
                                                                  bmc_password="given-pw"))
    assert again.bmc is not None and again.bmc.password_set
    assert (await any_store.nodes.credentials(node.id)).password == "given-pw"


async def test_api_tokens_listed_without_agent_tokens_and_revoked(any_store: Store) -> None:
    node = await any_store.nodes.create(new(1), actor="t")
    _, secret = await any_store.tokens.create("ops", Role.OPERATOR)
    await any_store.tokens.create("agent-1", Role.AGENT, node_id=node.id)
    listed = await any_store.tokens.api_tokens()
    assert [t.name for t in listed] == ["ops"] and listed[0].created_at is not None
    with pytest.raises(NotFound):
        await any_store.tokens.revoke("agent-1")  # the daemon's, not an operator's
    assert (await any_store.tokens.revoke("ops")).name == "ops"
    assert await any_store.tokens.lookup(secret) is None
    assert await any_store.tokens.api_tokens() == []


async def test_tokens_hashed_and_expiring(any_store: Store) -> None:
    info, token = await any_store.tokens.create("alice", Role.OPERATOR)
    assert token.startswith("pvt_") and (await any_store.tokens.lookup(token)) == info
    assert await any_store.tokens.lookup(token + "x") is None
    with any_store.engine.connect() as conn:
        assert token not in str(conn.execute(text("SELECT * FROM api_token")).all())
    past = datetime.now(UTC) - timedelta(seconds=1)
    _, expired = await any_store.tokens.create("old", Role.VIEWER, expires_at=past)
    assert await any_store.tokens.lookup(expired) is None
    with pytest.raises(Conflict):
        await any_store.tokens.create("alice", Role.VIEWER)


async def test_facts_merge_and_serials(any_store: Store) -> None:
    node = await any_store.nodes.create(new(1), actor="t")
    await any_store.nodes.merge_facts(node.id, {"cpu": {"cores": 8}})
    merged = await any_store.nodes.merge_facts(node.id, {"gpus": [{"device": "0x2330"}]})
    assert merged.facts == {"cpu": {"cores": 8}, "gpus": [{"device": "0x2330"}]}
    assert await any_store.nodes.serials() == frozenset({"SN0001"})


def test_migrations_are_idempotent_and_refuse_a_newer_schema(
    backend_settings: Settings,
) -> None:
    backend_settings.state_dir.mkdir(parents=True)
    engine = db.make_engine(backend_settings.sqlalchemy_url)
    assert db.current_revision(engine) is None
    with pytest.raises(SchemaError, match="provisioner db upgrade"):
        db.check_current(engine)
    assert db.upgrade(engine) == (None, db.head_revision())
    assert db.upgrade(engine) == (db.head_revision(), db.head_revision())
    db.check_current(engine)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'ffff_from_the_future'"))
    with pytest.raises(SchemaError, match="newer than this provisioner"):
        open_store(backend_settings)
    engine.dispose()


def test_sqlite_runs_in_wal_mode(tmp_path: Path) -> None:
    opened = open_store(Settings(state_dir=tmp_path))
    with opened.engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar_one() == "wal"
    opened.close()
    assert (tmp_path / "secret.key").stat().st_mode & 0o777 == 0o600


def test_migrations_match_the_models(backend_settings: Settings) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlmodel import SQLModel

    opened = open_store(backend_settings)
    with opened.engine.connect() as conn:
        drift = compare_metadata(MigrationContext.configure(conn), SQLModel.metadata)
    opened.close()
    assert drift == [], "models changed without a migration: " + repr(drift)


async def test_node_tokens_replaced_in_group_commits(any_store: Store) -> None:
    """A burst of nodes' tokens (a boot storm's iPXE scripts) share commits; each node
    keeps exactly its newest token, and a name taken twice is still a Conflict."""
    nodes = [await any_store.nodes.create(new(n), actor="t") for n in range(40)]
    expires = datetime.now(UTC) + timedelta(hours=1)

    async def replace(node_id: str, name: str) -> str:
        _, token = await any_store.boot_tokens.replace_for_node(
            name, Role.AGENT, node_id=node_id, expires_at=expires)
        return token

    first = await asyncio.gather(*(replace(n.id, f"agent:{n.id}:a") for n in nodes))
    second = await asyncio.gather(*(replace(n.id, f"agent:{n.id}:b") for n in nodes))
    for node, old, token in zip(nodes, first, second, strict=True):
        assert await any_store.tokens.lookup(old) is None  # revoked by the replacement
        info = await any_store.tokens.lookup(token)
        assert info is not None and info.node_id == node.id and info.role == Role.AGENT
        assert info.expires_at is not None and abs(info.expires_at - expires).total_seconds() < 1
    with any_store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM api_token")).scalar_one() == 40
    with pytest.raises(Conflict):
        await replace(nodes[1].id, f"agent:{nodes[0].id}:b")  # another node's token name


async def test_expiry_sweep_deletes_expired_tokens_and_expires_lapsed_leases(
        any_store: Store) -> None:
    from provisioner.lifecycle.sweeps import ExpirySweeps
    from provisioner.store.leases import AddressRange, Holder, LeaseRepo, LeaseState

    now = datetime.now(UTC)
    tokens = any_store.tokens
    await tokens.create("gone", Role.AGENT, expires_at=now - timedelta(seconds=1))
    _, kept = await tokens.create("kept", Role.AGENT, expires_at=now + timedelta(hours=1))
    _, forever = await tokens.create("forever", Role.VIEWER)
    leases = LeaseRepo(any_store.engine, any_store.pool)
    pool = AddressRange.parse("10.88.0.10-10.88.0.20", "255.255.255.0")
    lapsed = await leases.bind(Holder("52:54:00:88:00:01"), pool.first, pool, lease_time_s=0.0)
    live = await leases.bind(Holder("52:54:00:88:00:02"), pool.last, pool, lease_time_s=600.0)
    assert lapsed is not None and live is not None
    sweeps = ExpirySweeps(leases, tokens, interval_s=60.0, instance="test")
    swept = await sweeps.sweep()
    assert (swept.leases, swept.tokens) == (1, 1)
    assert not await sweeps.sweep()  # nothing left to sweep
    assert await tokens.lookup(kept) is not None and await tokens.lookup(forever) is not None
    states = {lease.mac: lease.state for lease in await leases.all()}
    assert states == {"52:54:00:88:00:01": LeaseState.EXPIRED,
                      "52:54:00:88:00:02": LeaseState.BOUND}

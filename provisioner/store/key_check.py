"""Every daemon of a fleet holds the same secret key, or does not start.

Each daemon keeps its key in its own ``state_dir/secret.key``; on one PostgreSQL a daemon
started with a key of its own (a state dir not copied, the operator error ``docs/ha.md``
warns of) encrypted new BMC passwords that the others could not read, and a random node
failed minutes later when another daemon took it over. The first daemon to start writes a
known text encrypted with its key (table ``secret_key_check``); every start decrypts it and
refuses, naming the key's fingerprint to copy, when it cannot. A database that holds
secrets from before this check is checked against one of them first.
"""

from __future__ import annotations

from sqlalchemy import Engine, or_
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from provisioner.errors import ConfigError
from provisioner.store.models import NodeRow, SecretKeyCheckRow
from provisioner.store.secretbox import SecretBox

CHECK_TEXT = "provisioner fleet secret key check v1"


def key_check_exists(engine: Engine) -> bool:
    with Session(engine) as session:
        return session.get(SecretKeyCheckRow, 1) is not None


def check_fleet_key(engine: Engine, box: SecretBox, *, key_path: str, instance: str) -> None:
    """Raise ConfigError unless ``box`` opens the fleet's secrets; record the check on the
    first start (a concurrent first start of another daemon is checked against, not
    overwritten)."""
    for _ in range(2):
        with Session(engine) as session:
            row = session.get(SecretKeyCheckRow, 1)
            if row is not None:
                if not box.opens(row.token):
                    raise _refusal(key_path, box, row.fingerprint, row.written_by)
                return
            stored = session.exec(select(NodeRow.bmc_password_enc, NodeRow.bmc_password_pending_enc)
                                  .where(or_(col(NodeRow.bmc_password_enc).is_not(None),
                                             col(NodeRow.bmc_password_pending_enc).is_not(None)))
                                  .limit(1)).first()
            if stored is not None and not box.opens(stored[0] or stored[1] or ""):
                raise _refusal(key_path, box, None, None)
            session.add(SecretKeyCheckRow(fingerprint=box.fingerprint,
                                          token=box.encrypt(CHECK_TEXT), written_by=instance))
            try:
                session.commit()
                return
            except IntegrityError:  # another daemon's first start won: check against its key
                session.rollback()
    raise ConfigError("secret key check: the database's key check could not be read")


def _refusal(key_path: str, box: SecretBox, fingerprint: str | None,
             written_by: str | None) -> ConfigError:
    if fingerprint is None:
        where = "the BMC passwords stored in the database were encrypted with another key"
    else:
        first = f", first used by daemon {written_by}" if written_by else ""
        where = (f"the fleet's secrets were encrypted with the key of fingerprint "
                 f"{fingerprint}{first}")
    return ConfigError(
        f"secret key file {key_path} (fingerprint {box.fingerprint}) does not open this "
        f"fleet's secrets: {where}. Every daemon on one database needs the same key: copy "
        "secret.key from the state_dir of a daemon that runs (mode 0600) and start again")

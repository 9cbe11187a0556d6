"""Secrets at rest: a Fernet key in a 0600 file under the state dir, created on a fresh
store's first start. A store that already holds encrypted secrets never gets a new key in
place of a lost one (every BMC call would fail): the daemon refuses to start instead."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

from provisioner.errors import ConfigError


class SecretBox:
    def __init__(self, key: bytes) -> None:
        self._fernet = Fernet(key)
        self.fingerprint = hashlib.sha256(key).hexdigest()[:16]
        """Names the key in messages (which key file to copy), never reveals it."""

    @staticmethod
    def new_key() -> bytes:
        return Fernet.generate_key()

    @classmethod
    def from_key_file(cls, path: Path, *, secrets_stored: int = 0) -> SecretBox:
        """Load the key, creating it (mode 0600, atomically) when it does not exist yet and
        the store holds no secret (``secrets_stored``: how many it holds); ConfigError when
        the key is missing but secrets are stored."""
        if not path.exists() and secrets_stored:
            raise ConfigError(
                f"secret key file {path} is missing but the database holds "
                f"{secrets_stored} secret(s) encrypted with it (BMC passwords, the fleet's "
                "key check): copy the key file from another daemon of this fleet or restore "
                "it from a backup; a new key could not decrypt them")
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            # a temporary file of this process's own (mode 0600): daemons sharing a state
            # dir start together, and one fixed name let one truncate the file another was
            # linking, or unlink it first (a daemon of the HA wave test failed to start)
            fd, name = tempfile.mkstemp(dir=path.parent, prefix=".secret-", suffix=".tmp")
            tmp = Path(name)
            with os.fdopen(fd, "wb") as fh:
                fh.write(SecretBox.new_key())
                fh.flush()
                os.fsync(fh.fileno())
            try:
                os.link(tmp, path)  # never replaces a key another process created first
            except FileExistsError:
                pass
            finally:
                tmp.unlink(missing_ok=True)
        if path.stat().st_mode & 0o077:
            raise ConfigError(f"secret key file {path} must not be readable by group or others")
        try:
            return cls(path.read_bytes().strip())
        except ValueError:
            raise ConfigError(f"secret key file {path} does not hold a valid key") from None

    def encrypt(self, plaintext: str) -> str:
        return self._fernet.encrypt(plaintext.encode()).decode("ascii")

    def opens(self, token: str) -> bool:
        """Whether this key decrypts ``token``."""
        try:
            self._fernet.decrypt(token.encode("ascii"))
        except (InvalidToken, ValueError):
            return False
        return True

    def decrypt(self, token: str) -> str:
        try:
            return self._fernet.decrypt(token.encode("ascii")).decode()
        except InvalidToken:
            raise ConfigError("a stored secret cannot be decrypted with this key file") from None

"""The one way repositories reach the database: a blocking function run with its own
session in the store's bounded thread pool, so no query ever blocks the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from sqlalchemy import Engine
from sqlmodel import Session

T = TypeVar("T")


class SessionRepo:
    def __init__(self, engine: Engine, pool: ThreadPoolExecutor) -> None:
        self._engine = engine
        self._pool = pool

    async def _run(self, fn: Callable[[Session], T]) -> T:
        """``fn(session)`` in the store pool; objects stay usable after the session ends."""

        def work() -> T:
            with Session(self._engine, expire_on_commit=False) as session:
                return fn(session)

        return await asyncio.get_running_loop().run_in_executor(self._pool, work)

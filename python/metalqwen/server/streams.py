"""The choices of one request (``n`` > 1: one job each) read together, as their chunks arrive."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator


async def merged(streams: list[AsyncIterator[Any]]) -> AsyncIterator[tuple[int, Any]]:
    """(index, item) of every stream as it comes, then (index, None) when that stream ends. The
    first exception of any stream is raised; leaving early (or raising) closes every stream."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[Any]) -> None:
        try:
            async for item in stream:
                await queue.put((index, item, None))
            await queue.put((index, None, None))
        except Exception as e:  # handed to the reader, which stops the others
            await queue.put((index, None, e))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        left = len(tasks)
        while left:
            index, item, error = await queue.get()
            if error is not None:
                raise error
            left -= item is None
            yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

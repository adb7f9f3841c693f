"""Asyncio tasks that take turns on one thread, each in a span: which task's span a stretch of time belongs
to is known. 200 jobs run 20 at a time; each does `fast_part` between yields, and two in fifty
(i % 50 in (7, 32): one odd, one even) also `slow_part`, which spins for 4 ms while the other 19 tasks of
its batch wait. The odd jobs mark their span with `async with ocular.span("job", i=i)`, the even ones
through the decorator (`decorated`, no attributes).

Usage: spans_async.py OUT.json. Writes the slow jobs' numbers to OUT.json.
"""

import asyncio
import json
import sys
import time

import ocular


def slow_part():
    t = time.perf_counter()
    while time.perf_counter() - t < 0.004:
        pass


def fast_part():
    return sum(range(300))


async def work(i):
    for _ in range(4):
        fast_part()
        await asyncio.sleep(0)
    if i % 50 in (7, 32):
        slow_part()
    await asyncio.sleep(0)


async def job(i):
    async with ocular.span("job", i=i):
        await work(i)


@ocular.span("decorated")
async def decorated(i):
    await work(i)


async def main():
    for batch in range(10):
        await asyncio.gather(*(job(i) if i % 2 else decorated(i) for i in range(batch * 20, batch * 20 + 20)))


asyncio.run(main())
with open(sys.argv[1], "w") as f:
    json.dump({"slow": [i for i in range(200) if i % 50 in (7, 32)]}, f)

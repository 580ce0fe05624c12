"""A webhook receiver in a process of its own: ``python -m benchmarks._receiver``
prints its URL, answers every POST 200, and stops at end of its standard input.

Run apart from a benchmark's measuring process, so that taking a burst of outcomes is
not charged to the requests that process times.
"""

from __future__ import annotations

import asyncio
import sys


async def _main() -> None:
    from aiohttp import web

    async def hook(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(text="ok")

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(f"http://127.0.0.1:{runner.addresses[0][1]}/hook", flush=True)
    # Standard input closed (the benchmark gone, or done): stop.
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(_main())

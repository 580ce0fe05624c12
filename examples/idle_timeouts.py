"""A TCP server that closes connections idle for too long, on tickwheel's event loop.

Every connection keeps an idle timeout (``asyncio.timeout``, rescheduled on each line
it receives), so the loop holds one pending deadline per connection, and every request
moves one. A client in a second process opens ``--connections`` connections on
localhost; every tenth keeps talking, the rest go quiet. The server must close
every quiet one, no sooner than ``--idle`` seconds after its last line, and none of
the talkers.

    python examples/idle_timeouts.py                     # as many as the file limit allows
    python examples/idle_timeouts.py --connections 5000 --loop asyncio
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import time

import tickwheel.aio

HOST = "127.0.0.1"
#: File descriptors kept back for the interpreter, the listener and the pipes.
RESERVED_FDS = 64


def file_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        # Raising the soft limit to the hard one is this process's own business.
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class Server:
    def __init__(self, idle: float) -> None:
        self.idle = idle
        self.accepted = 0
        self.closed_idle = 0
        self.closed_by_peer = 0
        self.early: list[float] = []
        self.late: list[float] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        loop = asyncio.get_running_loop()
        last = loop.time()
        try:
            async with asyncio.timeout_at(last + self.idle) as deadline:
                while line := await reader.readline():
                    writer.write(line)
                    last = loop.time()
                    deadline.reschedule(last + self.idle)
            self.closed_by_peer += 1
        except TimeoutError:
            self.closed_idle += 1
            waited = loop.time() - last
            (self.early if waited < self.idle else self.late).append(waited - self.idle)
        except ConnectionError:
            self.closed_by_peer += 1
        finally:
            writer.close()


async def serve(args: argparse.Namespace) -> int:
    server = Server(args.idle)
    listener = await asyncio.start_server(server.handle, HOST, 0, backlog=4096)
    port = listener.sockets[0].getsockname()[1]
    loop = asyncio.get_running_loop()
    print(f"{type(loop).__module__}.{type(loop).__name__} serving on {HOST}:{port}")
    client = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--client", str(port), "--connections",
        str(args.connections), "--idle", str(args.idle), stdout=asyncio.subprocess.PIPE)
    assert client.stdout is not None
    started = time.monotonic()
    while (line := await client.stdout.readline()):
        print(f"  client: {line.decode().strip()}")
    code = await client.wait()
    listener.close()
    await listener.wait_closed()
    quiet = args.connections - (args.connections + 9) // 10
    print(f"accepted {server.accepted:,} connections; closed {server.closed_idle:,} for "
          f"idleness, {server.closed_by_peer:,} by the client, in "
          f"{time.monotonic() - started:.1f} s")
    if server.late:
        worst = max(server.late)
        print(f"idle closes: at most {worst * 1000:.1f} ms after the deadline")
    if isinstance(loop, tickwheel.aio.EventLoop):
        print(f"the loop's wheel: {loop.timer_stats()}")
    ok = (code == 0 and server.accepted == args.connections and not server.early
          and server.closed_idle == quiet)
    print("every idle connection was closed by its timeout, none early, no talker"
          if ok else "FAILED: the counts above do not add up")
    return 0 if ok else 1


async def client(port: int, connections: int, idle: float) -> int:
    async def talk(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        # Talk for three idle periods, a line every third of one: never idle too long.
        for _ in range(9):
            writer.write(b"ping\n")
            if await reader.readline() != b"ping\n":
                return False
            await asyncio.sleep(idle / 3)
        writer.close()
        return True

    async def stay_quiet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        closed = await reader.read() == b""
        writer.close()
        return closed

    # Every tenth connection talks; each starts its part as soon as it is open, since
    # its idle clock on the server starts at the accept.
    talkers: list[asyncio.Task[bool]] = []
    quiet: list[asyncio.Task[bool]] = []
    for start in range(0, connections, 500):
        batch = await asyncio.gather(*(asyncio.open_connection(HOST, port)
                                       for _ in range(start, min(start + 500, connections))))
        for i, (reader, writer) in enumerate(batch, start):
            if i % 10 == 0:
                talkers.append(asyncio.create_task(talk(reader, writer)))
            else:
                quiet.append(asyncio.create_task(stay_quiet(reader, writer)))
    print(f"opened {connections:,} connections", flush=True)
    talked = await asyncio.gather(*talkers)
    closed = await asyncio.gather(*quiet)
    print(f"{sum(talked):,} talkers kept their connections; {sum(closed):,} quiet ones "
          "were closed by the server", flush=True)
    return 0 if all(talked) and all(closed) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=None,
                        help="default: 100,000, or as many as the file limit allows")
    parser.add_argument("--idle", type=float, default=2.0,
                        help="idle timeout in seconds (default: %(default)s)")
    parser.add_argument("--loop", choices=("tickwheel", "asyncio"), default="tickwheel")
    parser.add_argument("--client", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    limit = file_limit()
    most = limit - RESERVED_FDS
    if args.connections is None:
        args.connections = min(100_000, most)
    if not 1 <= args.connections <= most:
        parser.error(f"--connections must be between 1 and {most:,} (the file limit is "
                     f"{limit:,} per process), got {args.connections:,}")
    if not args.idle > 0:
        parser.error(f"--idle must be > 0, got {args.idle}")
    if args.client is not None:
        return asyncio.run(client(args.client, args.connections, args.idle))
    # Switching the loop on is this one argument.
    factory = tickwheel.aio.new_event_loop if args.loop == "tickwheel" else None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())

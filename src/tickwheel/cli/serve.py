"""``tickwheel serve``: the scheduler service with no flags needed."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Final

import typer

from tickwheel.cli._app import app, option, print_error
from tickwheel.cli.run import (
    ClockKind,
    Engine,
    check_driver_memory_option,
    listen_options,
    run,
)
from tickwheel.pipeline.contract.limits import DEFAULT_STOP_TIMEOUT_MS, MAX_TRIGGER_MS
from tickwheel.pipeline.contract.options import LATENESS_MS, PARTITIONS
from tickwheel.service.connections import DEFAULT_HEADER_TIMEOUT_S, DEFAULT_MAX_CONNECTIONS

__all__ = ["DEFAULT_DATA", "DEFAULT_LISTEN", "SERVE_LATENESS_MS", "serve"]

DEFAULT_DATA: Final = Path("tickwheel-data")
DEFAULT_LISTEN: Final = "127.0.0.1:8470"
#: How late a row may come: the service stamps rows itself, so 100 ms is plenty.
SERVE_LATENESS_MS: Final = 100
#: The service's directories in ``--data``.
INPUT: Final = "input"
OUTPUTS: Final = "outputs"


@app.command()
def serve(
    data: Annotated[Path, typer.Option(
        help="everything the service keeps: DATA/input (rows landed by the API, and "
             "files you drop in), DATA/outputs (outcomes, quarantine, dead letters) and "
             "its checkpoint, DATA/outputs/_checkpoint")] = DEFAULT_DATA,
    listen: Annotated[str, typer.Option(
        metavar="[HOST:]PORT", help="the API's address (beyond loopback, with "
                                    "--token-file)")] = DEFAULT_LISTEN,
    engine: Annotated[Engine, typer.Option(help="which engine resolves the rows")
                      ] = Engine.local,
    lateness_ms: Annotated[int, option(
        LATENESS_MS, help="rows this far behind the newest are late")] = SERVE_LATENESS_MS,
    deliver_to: Annotated[str | None, typer.Option(
        help="POST outcomes to this http(s) URL, at least once, each with a stable id")
    ] = None,
    targets: Annotated[Path | None, typer.Option(
        "--targets", metavar="FILE",
        help="deliver outcomes to the targets this TOML file defines; rows name theirs in "
             "'target'")] = None,
    processor: Annotated[str | None, typer.Option(
        help="deliver every outcome to this processor, MODULE:NAME")] = None,
    stop_timeout_ms: Annotated[int, typer.Option(
        min=0, max=MAX_TRIGGER_MS,
        help="how long a stop waits for the receiver; the rest is delivered at the next "
             "start")] = DEFAULT_STOP_TIMEOUT_MS,
    token_file: Annotated[Path | None, typer.Option(
        help="every request must carry Authorization: Bearer <the token in this file>")
    ] = None,
    insecure_no_auth: Annotated[bool, typer.Option(
        "--insecure-no-auth", help="listen beyond loopback without a token")] = False,
    max_connections: Annotated[int, typer.Option(
        min=1, max=1_000_000, help="connections held at once")] = DEFAULT_MAX_CONNECTIONS,
    header_timeout_ms: Annotated[int, typer.Option(
        min=1, max=3_600_000, help="a connection without a request head this long is "
                                   "closed")] = round(DEFAULT_HEADER_TIMEOUT_S * 1000),
    metrics_port: Annotated[int | None, typer.Option(
        min=0, max=65535, help="also serve Prometheus metrics on this port (they are on "
                               "the API's /metrics already)")] = None,
    master: Annotated[str | None, typer.Option(
        help="--engine spark: the master URL (default: local[2])")] = None,
    partitions: Annotated[int | None, option(
        PARTITIONS, help="--engine spark: partitions, fixed by the first start")] = None,
    driver_memory: Annotated[str | None, typer.Option(
        callback=check_driver_memory_option,
        help="--engine spark: the driver JVM's memory (default: 4g)")] = None,
    conf: Annotated[list[str] | None, typer.Option(
        "--conf", metavar="KEY=VALUE", help="--engine spark: a Spark setting; repeat "
                                            "for more")] = None,
) -> None:
    """Run the scheduler service on the wall clock: rows over HTTP, deadlines and
    schedules fired on time, outcomes written and delivered. SIGINT or SIGTERM stops
    it; a start on the same --data carries on."""
    # Refused before the directory is made: run checks them again, as it checks its own.
    listen_options(listen, True, max_connections, header_timeout_ms, token_file,
                   insecure_no_auth)
    try:
        if data.exists() and not data.is_dir():
            raise NotADirectoryError(f"--data {data}: not a directory")
        (data / INPUT).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print_error(f"--data {data}: {exc.strerror or exc}" if not isinstance(
            exc, NotADirectoryError) else str(exc))
        raise typer.Exit(2) from exc
    run(input=data / INPUT, output=data / OUTPUTS, engine=engine, lateness_ms=lateness_ms,
        follow=True, clock=ClockKind.wall, listen=listen, deliver_to=deliver_to,
        targets=targets,
        processor=processor, stop_timeout_ms=stop_timeout_ms, token_file=token_file,
        insecure_no_auth=insecure_no_auth, max_connections=max_connections,
        header_timeout_ms=header_timeout_ms, metrics_port=metrics_port, master=master,
        partitions=partitions, driver_memory=driver_memory, conf=conf)

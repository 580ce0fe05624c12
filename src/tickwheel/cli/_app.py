"""The ``tickwheel`` command's app and console, and what its commands share."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress, ProgressColumn

from tickwheel._signals import stop_on_signals
from tickwheel.pipeline.contract.options import OptionSpec
from tickwheel.pipeline.io.input_dir import INPUT_NAMES

if TYPE_CHECKING:
    from tickwheel.client import Client

app = typer.Typer(help="tickwheel: delayed operations at any scale.", no_args_is_help=True,
                  add_completion=False)
# No markup: what is printed holds paths, file names and data, whose brackets rich
# would read as its own tags ("tickwheel[spark]" printed as "tickwheel").
# Paths are printed as they are: no markup, and no emoji for a ":name:" in one.
console = Console(markup=False, emoji=False)
if not console.is_terminal:  # logs and pipes get the whole table, not an 80-column cut
    console = Console(width=120, markup=False, emoji=False, soft_wrap=True)


def _show_version(value: bool) -> None:
    if value:
        import tickwheel

        for line in tickwheel._build_lines():
            print(line)
        raise typer.Exit()


@app.callback()
def _options(version: Annotated[bool, typer.Option(
        "--version", callback=_show_version, is_eager=True,
        help="print the version, and whether the core is compiled, and exit")] = False,
             ) -> None:
    pass


def option(spec: OptionSpec[Any], *, help: str | None = None, **settings: Any) -> Any:
    """``spec`` as a typer option: its flag (a flag with its ``--no-`` form), range and
    help, the help led by the engine it applies to; ``help`` in place of the spec's for
    a command that says it shorter. The default is the parameter's own."""
    if help is None:
        help = spec.help if spec.engine is None else f"{spec.engine}: {spec.help}"
    flag = (f"{spec.flag}/--no-{spec.flag.removeprefix('--')}" if spec.kind == "flag"
            else spec.flag)
    return typer.Option(flag, min=spec.minimum, max=spec.maximum, help=help, **settings)


def progress_bar(*columns: ProgressColumn) -> Progress:
    # Shown on a terminal only: elsewhere a bar still writes a blank line, and a pipe
    # closed early (| head) would then stop the work itself, not just its printing.
    return Progress(*Progress.get_default_columns(), *columns, console=console,
                    transient=True, disable=not console.is_terminal)


def print_error(message: str) -> None:
    console.print(message, style="red", soft_wrap=True)  # one line, whatever its length


def warn_no_input(input: Path) -> None:
    # An empty run is valid (a day without events), but more often a wrong directory.
    console.print(f"no input files in {input}: the engines read {INPUT_NAMES}",
                  style="yellow")




def stopping_on_signals(when: str = "after this batch",
                     ) -> contextlib.AbstractContextManager[threading.Event]:
    """SIGINT and SIGTERM set the event (the run stops at a batch boundary); a second
    SIGINT interrupts at once."""
    return stop_on_signals(lambda name: console.print(f"{name}: stopping {when}"))


def service_client(url: str, token_file: Path | None) -> Client:
    """A client of the service at ``url``, with its token; exit 2 for a URL or token
    file that cannot be used, or without the service extra."""
    try:
        from tickwheel.client import Client
        from tickwheel.service.auth import TokenError, read_token
        from tickwheel.service.webhook import check_webhook_url

        check_webhook_url(url)
        token = None if token_file is None else read_token(token_file)
    except ImportError as exc:
        print_error("this needs the service extra: pip install 'tickwheel[service]'")
        raise typer.Exit(2) from exc
    except TokenError as exc:
        print_error(f"--token-file {exc}")
        raise typer.Exit(2) from exc
    except ValueError as exc:
        print_error(f"URL: {exc}")
        raise typer.Exit(2) from exc
    return Client(url, token=token)


def read_one(url: str, token_file: Path | None, missing: str,
             fetch: Callable[[Client], dict[str, Any] | None]) -> dict[str, Any]:
    """One record read from the service at ``url``; exit 1 naming ``missing`` when it
    holds none, or with the reason when the service refuses or cannot be reached."""
    from tickwheel.client import SubmitError

    with service_client(url, token_file) as client:
        try:
            found = fetch(client)
        except (SubmitError, OSError) as exc:
            print_error(f"{url}: {exc}")
            raise typer.Exit(1) from exc
    if found is None:
        print_error(missing)
        raise typer.Exit(1)
    return found


def plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "es" if noun.endswith("ch") else "s")

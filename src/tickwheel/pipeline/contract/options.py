"""The options of a pipeline run, declared once: ``tickwheel run`` (typer) and the Spark
engine's spark-submit application (argparse) each make their flags from these records,
so a flag's name, range, default and help are written in one place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Generic, Literal, TypeVar

from tickwheel.pipeline.contract.limits import (
    DEFAULT_LATENESS_MS,
    DEFAULT_TRIGGER_MS,
    FOLLOW_DEDUPE_RETENTION_MS,
    MAX_FILES_PER_TRIGGER,
    MAX_LATENESS_MS,
    MAX_PARTITIONS,
    MAX_RETENTION_MS,
    MAX_TRIGGER_MS,
)

__all__ = ["CHECKPOINT", "CLOCK", "CLOCKS", "DEDUPE_RETENTION_MS", "FILES_PER_TRIGGER",
           "FINAL", "FOLLOW", "INPUT", "LATENESS_MS", "OUTPUT", "OVERWRITE", "PARTITIONS",
           "RUN_OPTIONS", "TRIGGER_MS", "OptionKind", "OptionSpec", "follow_only_problem"]

T_co = TypeVar("T_co", covariant=True)

#: What an option's value is: a whole number in a range, a path, a flag (with its
#: ``--no-`` form), or one of a few words.
OptionKind = Literal["int", "path", "flag", "choice"]


@dataclass(frozen=True, slots=True)
class OptionSpec(Generic[T_co]):
    """One option as every front door declares it."""

    flag: str
    kind: OptionKind
    default: T_co
    help: str
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] = ()
    #: The engine the option applies to, where a front door runs either engine: its
    #: help then starts with it ("Spark: ...").
    engine: str | None = None

    @property
    def dest(self) -> str:
        """The option's name as a Python identifier: ``--lateness-ms`` is ``lateness_ms``."""
        return self.flag.removeprefix("--").replace("-", "_")

    def check(self, value: int) -> int:
        """``value`` if it is within the option's range; otherwise ValueError saying
        which bound it passes."""
        if self.minimum is not None and value < self.minimum:
            raise ValueError(f"must be at least {self.minimum}, got {value}")
        if self.maximum is not None and value > self.maximum:
            raise ValueError(f"must be at most {self.maximum}, got {value}")
        return value


#: ``--clock``'s words: time moves with the rows only, or with the wall clock too.
CLOCKS: Final = ("event", "wall")

INPUT: Final[OptionSpec[str | None]] = OptionSpec("--input", "path", None, "event log directory")
OUTPUT: Final[OptionSpec[str | None]] = OptionSpec(
    "--output", "path", None, "writes outcomes/ and quarantine/ here")
CHECKPOINT: Final[OptionSpec[str | None]] = OptionSpec(
    "--checkpoint", "path", None, "checkpoint directory (default: OUTPUT/_checkpoint)")
LATENESS_MS: Final[OptionSpec[int]] = OptionSpec(
    "--lateness-ms", "int", DEFAULT_LATENESS_MS,
    "rows this far behind the largest ts_ms read so far are late",
    minimum=0, maximum=MAX_LATENESS_MS)
DEDUPE_RETENTION_MS: Final[OptionSpec[int | None]] = OptionSpec(
    "--dedupe-retention-ms", "int", None,
    "remember an op_id this long after its first watch (and while it is pending) to "
    "quarantine duplicates; later, a watch of it starts a new operation (default: "
    "forever)", minimum=0, maximum=MAX_RETENTION_MS)
PARTITIONS: Final[OptionSpec[int | None]] = OptionSpec(
    "--partitions", "int", None,
    "partitions of the key space and of the op-id space, fixed by a checkpoint's first "
    "run (default: the master's parallelism)",
    minimum=1, maximum=MAX_PARTITIONS, engine="Spark")
FILES_PER_TRIGGER: Final[OptionSpec[int | None]] = OptionSpec(
    "--max-files-per-trigger", "int", None,
    "input files per micro-batch (Spark) or per batch (local --follow; default: all new "
    "files, within the engine's bytes per batch)", minimum=1, maximum=MAX_FILES_PER_TRIGGER)
OVERWRITE: Final[OptionSpec[bool]] = OptionSpec(
    "--overwrite", "flag", False,
    "clear earlier outputs in OUTPUT first (and OUTPUT/_checkpoint); without it OUTPUT "
    "must be empty or new, or, for Spark, hold its checkpoint's own outputs")
FINAL: Final[OptionSpec[bool]] = OptionSpec(
    "--final", "flag", True,
    "end the input when done, so every row is applied (as the local engine does); "
    "--no-final leaves the last lateness-ms of rows held for more input", engine="Spark")
FOLLOW: Final[OptionSpec[bool]] = OptionSpec(
    "--follow", "flag", False,
    "run as a service: read files as they land, until SIGINT or SIGTERM; a restart on "
    "the same output carries on (dedupe retention defaults to "
    f"{FOLLOW_DEDUPE_RETENTION_MS // 1000} s)")
TRIGGER_MS: Final[OptionSpec[int]] = OptionSpec(
    "--trigger-ms", "int", DEFAULT_TRIGGER_MS,
    "--follow: a batch this often when nothing falls due sooner",
    minimum=1, maximum=MAX_TRIGGER_MS)
CLOCK: Final[OptionSpec[str]] = OptionSpec(
    "--clock", "choice", CLOCKS[0],
    "--follow: time moves with the rows' ts_ms only (event), or also with the wall clock "
    "(epoch ms), so deadlines fire without new rows", choices=CLOCKS)

#: The options of a run over an event log, in the order ``--help`` lists them.
RUN_OPTIONS: Final[tuple[OptionSpec[object], ...]] = (
    INPUT, OUTPUT, CHECKPOINT, LATENESS_MS, DEDUPE_RETENTION_MS, PARTITIONS,
    FILES_PER_TRIGGER, OVERWRITE, FINAL, FOLLOW, TRIGGER_MS, CLOCK)


def follow_only_problem(*, follow: bool, final: bool, trigger_ms: int, clock: str) -> str | None:
    """What is wrong with options that only a run as a service takes, given to a run
    that is not one (or ``--no-final``, given to one); None when nothing is."""
    if not follow and (trigger_ms != TRIGGER_MS.default or clock != CLOCK.default):
        return "--trigger-ms and --clock apply to --follow only"
    if follow and not final:
        return "--no-final does not apply to --follow: a service never ends its input"
    return None

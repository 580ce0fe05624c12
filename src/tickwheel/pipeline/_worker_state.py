"""What a Spark Python worker keeps between the tasks it runs.

A module of its own, reached through the module: the shard processor's class is made
inside a function, so cloudpickle ships it by value, and with it a copy of every
module-level dict its methods name. Each task got fresh, empty dicts, and nothing was
ever found in them. A module is shipped by name: every task of a worker finds these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tickwheel.pipeline._seen_log import LogHead
    from tickwheel.pipeline.shard import Shard

__all__ = ["SEEN", "SHARDS", "SHARDS_LIMIT"]

#: Shards this worker saved, by the token saved with them.
SHARDS: dict[str, tuple[Shard, LogHead]] = {}
SHARDS_LIMIT = 64
#: Per shard, the seen-id set this worker saved last and the log head it matches.
SEEN: dict[int, tuple[set[str], LogHead]] = {}

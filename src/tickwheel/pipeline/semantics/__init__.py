"""What decides outcomes: the purgatory over rows (:mod:`.resolver`, with the
recurring schedules of :mod:`.schedule_book`), and its two partitioned stages
(:mod:`.key_stage`, :mod:`.op_stage`) with the partitions that hold them
(:mod:`.partition`). Nothing here reads or writes a file."""

"""State kept between batches: the checkpoints' encoding and format numbers
(:mod:`.encoding`), partition heads (:mod:`.heads`), a partition's entries as a log of
chunks for either engine (:mod:`.entry_log`, kept in files by :mod:`.entry_files`), the
local engine's checkpoint as a whole (:mod:`.local_checkpoint`), the log of batches
applied (:mod:`.batch_log`), the seen op ids as segments for either engine
(:mod:`.seen_log`, kept in files by :mod:`.seen_files`), rows
spilled in sorted runs (:mod:`.spilled_runs`), and what outlives batches kept out of the
garbage collector's walk (:mod:`.collector`)."""

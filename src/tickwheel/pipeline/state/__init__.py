"""State kept between batches: the log of batches applied (:mod:`.batch_log`), the seen
op ids as segments (:mod:`.seen_segments`), rows spilled in sorted runs
(:mod:`.spilled_runs`), and what outlives batches kept out of the garbage collector's
walk (:mod:`.collector`)."""

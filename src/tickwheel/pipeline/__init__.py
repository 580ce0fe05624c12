"""The purgatory over event streams. Subpackages, lowest first (nothing imports one
listed after it): :mod:`.contract` (rows, options, routing), :mod:`.semantics` (what
decides outcomes), :mod:`.io` (input, outputs, files), :mod:`.state` (what is kept
between batches), :mod:`.delivery` (outcomes handed on), :mod:`.engines` (the Spark-free
engines), :mod:`.spark` (the Spark engine) and :mod:`.tools` (generator, reports)."""

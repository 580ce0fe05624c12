"""The purgatory over event streams: the event log, the reference engine and (later)
the Spark engine, the generator and the reports."""

"""The purgatory over event streams, Spark-free: the event-log contract and its
semantics, the reference engine, the two partitioned stages, the local engine as a
service, the input and output files, the generator and the reports. The Spark engine
is the subpackage :mod:`tickwheel.pipeline.spark`."""

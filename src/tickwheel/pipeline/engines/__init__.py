"""The Spark-free engines: the reference engine over a whole log (:mod:`.reference`),
the same two stages partitioned in one process (:mod:`.partitioned`), and the local
engine as a service that follows an input directory (:mod:`.follow`). The Spark engine
is :mod:`tickwheel.pipeline.spark`."""

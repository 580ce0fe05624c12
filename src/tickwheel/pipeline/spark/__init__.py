"""The Spark engine: the pipeline as a Spark Structured Streaming query (needs
``pip install 'tickwheel[spark]'`` and a JVM). See :mod:`tickwheel.pipeline.spark.engine`.
"""

from tickwheel.pipeline.spark._session import spark_session, stop_spark
from tickwheel.pipeline.spark.engine import CHECKPOINT_FORMAT, SparkEngine, SparkRunResult

__all__ = ["CHECKPOINT_FORMAT", "SparkEngine", "SparkRunResult", "spark_session", "stop_spark"]

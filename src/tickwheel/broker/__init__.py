"""Kafka's broker uses of the purgatory, as small faithful models.

- :mod:`tickwheel.broker.replication`: replicated partitions, acks=all produce waiting
  for the high watermark, fetch waiting for min bytes.
- :mod:`tickwheel.broker.groups`: consumer-group sessions kept alive by heartbeats.

Built only on the public purgatory API.
"""

from tickwheel.broker._listener import BrokerListener

__all__ = ["BrokerListener"]

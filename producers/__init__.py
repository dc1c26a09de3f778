"""pulse.producers: publish epoch batches and hook events to Kafka, with a disk spool."""

from .publisher import Publisher, ensure_topics
from .replay import ReplayClock, publish_trace, replay_items
from .spool import Spool
from .sync import SyncPublisher, publish_batches

__all__ = ["Publisher", "ReplayClock", "Spool", "SyncPublisher", "ensure_topics", "publish_batches",
           "publish_trace", "replay_items"]

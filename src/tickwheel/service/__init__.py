"""The scheduler as a service: rows taken over HTTP (:class:`SubmitServer`, durable
group commits into the input directory) and outcomes delivered by webhook
(:class:`WebhookProcessor`). Needs the ``service`` extra (aiohttp, httpx); the clients
are in :mod:`tickwheel.client`."""

from tickwheel.service.server import IntakeStats, SubmitServer
from tickwheel.service.webhook import (
    DEAD_LETTER_DIR,
    WebhookProcessor,
    WebhookStats,
    check_webhook_url,
)

__all__ = ["DEAD_LETTER_DIR", "IntakeStats", "SubmitServer", "WebhookProcessor",
           "WebhookStats", "check_webhook_url"]

"""The scheduler as a service: outcomes delivered by webhook (more to come: submission
over HTTP). Needs the ``service`` extra (httpx)."""

from tickwheel.service.webhook import (
    DEAD_LETTER_DIR,
    WebhookProcessor,
    WebhookStats,
    check_webhook_url,
)

__all__ = ["DEAD_LETTER_DIR", "WebhookProcessor", "WebhookStats", "check_webhook_url"]

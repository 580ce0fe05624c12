"""Outcomes handed on: a user's processor, or the batching dispatcher to a webhook
(:mod:`.sink`), fed committed batches in order by :mod:`.batch_delivery`."""

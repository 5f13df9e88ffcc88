"""The bounded HTTP listener every service API uses, its guard (read token, refusals) and the
address rules (who counts as loopback)."""

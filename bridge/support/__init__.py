"""Helpers every layer uses: files written atomically and fsynced, retry backoff, time formats,
secret redaction, JSON logs and rate-limited log lines. They import nothing of the product."""

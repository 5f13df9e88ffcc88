"""scheduled-events-bridge: forward Azure IMDS Scheduled Events, relay approvals back."""

__version__ = "0.1.0"

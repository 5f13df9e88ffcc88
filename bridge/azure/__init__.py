"""Azure's own Scheduled Events channel (Event Grid, Resource Graph) and its reconciliation with the
agents' records: ``se-bridge azure-channel`` (docs/azure-channel.md)."""

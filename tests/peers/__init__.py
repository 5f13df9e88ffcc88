"""Real peers the integration tests start on free loopback ports, speaking the real protocols."""

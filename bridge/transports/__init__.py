"""Transports: what a sink and a source of the same system share (as Vector shares ``src/kafka.rs``
between its Kafka source and sink).

A ``kafka://`` or ``eventhubs://`` spec means the same thing whether the agent writes to it (a sink,
:mod:`bridge.sinks`) or the approver reads from it (a decision source, :mod:`bridge.streams`):
the same options, the same validation, the same credentials, the same classification of the client
library's errors. That knowledge lives here, once, so the two directions cannot drift apart and neither
has to build the other to read its settings. Each side adds only its own part (a producer or a
consumer, its delivery or checkpoint options) and its own wording: every helper takes an
:class:`~bridge.transports.base.Owner` ("kafka sink", "eventhubs source") that starts its messages
and builds its errors.

The layer sits between :mod:`bridge.pipeline` and the sinks and sources, and imports neither (an
import contract in ``pyproject.toml`` says so). Modules:

* :mod:`~bridge.transports.base`: :class:`~bridge.transports.base.Owner`, spec option helpers;
* :mod:`~bridge.transports.secrets`: :class:`~bridge.transports.secrets.SecretRef`, a secret named by
  an environment variable or a file (``*_env`` / ``*_file`` options);
* :mod:`~bridge.transports.azure`: the Entra ID credential (managed identity or the default chain);
* :mod:`~bridge.transports.kafka` and :mod:`~bridge.transports.eventhubs`: one per system.

Nothing here imports a cloud SDK or librdkafka at module level except :mod:`bridge.transports.kafka`,
which is itself imported only when a ``kafka://`` spec is used: an agent writing to a file loads none.
"""

"""The commands beside ``cli``: the demo and its console fleet, ``decide``, the installers' config
and health checks. They compose services and layers; nothing below imports them."""

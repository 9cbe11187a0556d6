"""A simulated rack: persistent fake hardware that the ``fake`` drivers act on.

For demos, scale runs and crash tests."""

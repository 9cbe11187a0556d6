"""A simulated rack: persistent fake hardware the ``fake`` drivers act on (demos, scale, crash tests)."""

"""llmd: a local LLM daemon with an OpenAI-compatible API over a supervised native engine.

The package is five wings that import one way - ``cli`` -> ``api`` -> ``text`` -> ``runtime``
-> ``store`` - beside ``worker`` (the worker process, which may use ``text``, ``runtime`` and
``store`` but is never imported by the daemon), over three leaf modules any wing may use:
``paths``, ``errors`` and ``limits``. tests/unit/test_layering.py holds the package to it.
"""

__version__ = "0.1.0"

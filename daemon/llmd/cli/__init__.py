"""The `llmd` command line (main.py; `serve` in serve.py), pull progress bars, remote model
management and the user service install (launchd / systemd).

The top of the stack beside the worker process: may import any wing except `llmd.worker`.
"""

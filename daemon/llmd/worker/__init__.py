"""The worker: hosts the native engine for one model and speaks the JSONL protocol.

Imported only inside worker processes; the daemon uses :mod:`llmd.worker.launch` alone.
"""

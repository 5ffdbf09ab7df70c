"""The worker: hosts the native engine for one model and speaks the JSONL protocol.

Imported only inside worker processes (`python -m llmd.worker`); the daemon starts it with
:mod:`llmd.runtime.worker_launch` and never imports this package. May import `llmd.text` (the
grammar's tokenizer), `llmd.runtime` (the protocol), `llmd.store` and the leaf modules.
"""

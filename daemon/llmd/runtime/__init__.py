"""Workers and their lives: the registry of loaded models, each model's supervisor (spawn,
warm up, watch, restart), the client side of a worker process and the JSONL protocol it speaks,
named sessions, keep-alive, speculative decoding's switches, the counters the runtime and the
pipeline update, and a remote model's upstream (slots, health, errors).

Deals in token ids and processes, not text: a model's text side is handed in by the text layer
(`TextSide`). May import `llmd.store` and the leaf modules only.
"""

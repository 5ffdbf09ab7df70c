"""The HTTP API: the aiohttp app (server.py), its security and limits, and every protocol
clients speak - OpenAI (chat, completions, embeddings, rerank, FIM infill), Anthropic Messages,
OpenAI Responses, Ollama - plus pulls, remotes and the rendering of `/metrics`.

Each protocol module validates its request, translates it into the one pipeline (`llmd.text`)
and translates the events back into its own JSON or stream frames. May import `llmd.text`,
`llmd.runtime`, `llmd.store` and the leaf modules (paths, errors, limits); never `llmd.cli`.
"""

"""The text world: what turns a validated request into prompt tokens and the model's tokens
back into an answer - the one chat pipeline every protocol translates into, generation,
tokenizers, chat templates, detokenizing, stop strings, reasoning and tool-call parsing
(`tools/`), logprobs, structured output, FIM, embeddings and reranking, and the bridge that
lets remote models answer through the same pipeline.

Knows no HTTP: what a generation needs from the request arrives as a `RequestContext`. May
import `llmd.runtime`, `llmd.store` and the leaf modules; never `llmd.api` or `llmd.cli`.
"""

"""Models on disk and from the hub: manifests and content-addressed blobs, installing local
files and directories, the hub client, pulls and the resumable downloader, pull-time
conversion, the catalog, GGUF readers, what the engine supports, what a model is for (its
kind) and what `llmd show` says about it, and the remote models' records.

The bottom of the stack: may import the leaf modules (paths, errors, limits) only.
"""

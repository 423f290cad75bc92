"""Gated DeltaNet (GDN) family: chunked prefill (chunk.py). See spec.py for the compiled bases."""

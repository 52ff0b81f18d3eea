"""Speculative decoding of real Hugging Face causal language models (extra ``[hf]``).

Work in progress (issue 12): :mod:`.models` fetches and loads the hash-pinned real weights,
:mod:`.decoder` drives the torch backend's verifiers with real models.
"""

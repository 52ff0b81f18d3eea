"""Batched torch lowering of the discrete schemes (installed as ``specsampling.gpu``).

Not in this release: the package exists so the layout of the design card installs, and the
torch backend lands here in a later release. Nothing here is imported by the core.
"""

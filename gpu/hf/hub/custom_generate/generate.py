"""The directory form of specsampling's ``custom_generate`` entry.

transformers runs ``custom_generate/generate.py`` of a directory passed as
``model.generate(custom_generate=<directory>, trust_remote_code=True, ...)`` and hands it every
``generate`` argument, ``assistant_model`` included (a callable ``custom_generate`` never sees
that one). This file is that directory's entry: it only forwards to
:func:`specsampling.gpu.hf.custom_generate.generate_with_arguments`.
"""

from specsampling.gpu.hf.custom_generate import generate_with_arguments


def generate(model, **arguments):
    return generate_with_arguments(model, **arguments)

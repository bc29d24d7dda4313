"""The settings models, one module per concern, each the object its code takes as it is.

``reclaimd.config`` composes them into ``Settings`` (one YAML file, then ``RECLAIMD_*``
overrides); a part imports only its own model from here, so nothing here imports the parts,
the config or a source. Every default and every field's documentation is written once, here.
What is discovered at run time (the Kueue API version, the holder name) is a constructor
argument of the code, never a field.
"""

"""The config layer: params loading and validation, the typed schema, input specs. Imports nothing
itself, so a stage importing one module here does not load the rest."""

"""The core layer: values, files and rules every other layer builds on (no project import above it).
Imports nothing itself, so a stage importing one module here does not load the rest."""

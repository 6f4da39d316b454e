"""What each stage does, as library functions (layer 4 of ARCHITECTURE.md): stages/*.py parse
arguments, call one function here and write their outs. Modules here never import stages."""

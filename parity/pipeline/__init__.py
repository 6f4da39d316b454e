"""What each stage does, as library functions (the pipeline layer): stages/*.py parse
arguments, call one function here and write their outs. Modules here never import stages."""

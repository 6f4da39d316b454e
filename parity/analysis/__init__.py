"""Analysis of captured values: the fp64 oracle verdict, each layer's own error, causes, plans."""

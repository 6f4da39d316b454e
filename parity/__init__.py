"""parity: cached, versioned numerical-parity validation of ML models across backends and precisions.

Library code used by the DVC stages in `stages/`. Light modules (config, io, store, compare,
fingerprint, report) import numpy/pyarrow/yaml only; torch is imported only by parity.models,
parity.pipeline.layer_export and the torch runners.
"""

__version__ = "0.1.0"

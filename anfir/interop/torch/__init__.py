"""torch.export: an ``ExportedProgram`` (or a ``.pt2`` file) to an anfir Module.

* :mod:`anfir.interop.torch.importer` — the FX walk, the signature, locations;
* :mod:`anfir.interop.torch.rules` — the table from ATen ``OpOverload`` to builder,
  one module per family of the anfir primitive a rule produces (as in
  ``anfir/primitives/``), shared helpers in :mod:`anfir.interop.torch.rules.common`.

Every module here uses absolute imports, so ``import torch`` inside this package is
PyTorch, never this package; nothing here imports torch at import time unless a
function that needs it is called.
"""

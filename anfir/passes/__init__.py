"""Pipeline phases, one module each (``resolve``, ``specialize``, ``ad``, ...)."""

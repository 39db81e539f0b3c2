"""Text front ends: the ANF language (``anf.lark``, :mod:`anfir.grammar.parser`).

Import what you need from the submodules (``from anfir.grammar.parser import
parse_module``); this package imports nothing itself, so its modules load
independently.
"""

"""The IR: nodes, graphs, the manager, cloning and walks (MindIR's model)."""

from anfir.ir.annotations import ScalarAnn, TensorAnn, TupleAnn, TypeAnn
from anfir.ir.clone import Cloner, clone, clone_scope, inline_call
from anfir.ir.graph import FuncGraph, Module
from anfir.location import Location
from anfir.ir.manager import Manager, manage
from anfir.ir.nodes import CNode, Node, ParameterNode, ValueNode, is_constant
from anfir.ir.walk import all_cnodes, reachable_graphs, toposort

__all__ = [
    "CNode", "Cloner", "FuncGraph", "Location", "Manager", "Module", "Node", "ParameterNode",
    "ScalarAnn", "TensorAnn", "TupleAnn", "TypeAnn", "ValueNode", "all_cnodes", "clone",
    "clone_scope", "inline_call", "is_constant", "manage", "reachable_graphs", "toposort",
]

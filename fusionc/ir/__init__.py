"""The fusionc IR: types, nodes, op registry, text form (print/parse) and verifier."""
from fusionc.ir.nodes import Graph, Module, Op, SymbolRef, Value
from fusionc.ir.parser import parse_file, parse_module
from fusionc.ir.printer import print_graph, print_module, print_op
from fusionc.ir.registry import OpDef, all_ops, lookup, register
from fusionc.ir.types import DType, TensorType, tensor
from fusionc.ir.verifier import verify_graph, verify_module, verify_op

__all__ = ["Graph", "Module", "Op", "SymbolRef", "Value", "parse_file", "parse_module",
           "print_graph", "print_module", "print_op", "OpDef", "all_ops", "lookup", "register",
           "DType", "TensorType", "tensor", "verify_graph", "verify_module", "verify_op"]

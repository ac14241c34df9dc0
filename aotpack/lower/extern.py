"""Extern calls: normalise an FX node's arguments to its ATen schema.

Every schema argument is given explicitly (defaults filled in) and tagged with the
``AotpackArgKind`` the generated C++ passes to the runtime's dispatcher call
(model_abi.h); tensors become (base buffer, sizes, strides, offset) views.
"""
from __future__ import annotations

from typing import Callable

import torch

from aotpack.errors import AotpackError
from aotpack.ir.graph import ExternArg, Value

#: (python type, kind) in the order they are tested: bool before int (bool is an int)
_SCALARS = [(torch.dtype, "scalar_type"), (torch.layout, "layout"), (torch.memory_format, "memory_format"),
            (str, "string"), (bool, "bool"), (int, "int"), (float, "double")]


def schema_values(node) -> list[tuple]:
    """``(schema argument, value)`` for every argument of ``node.target``'s schema.

    Raises:
        AotpackError: a required argument is missing.
    """
    found = []
    for position, argument in enumerate(node.target._schema.arguments):
        if position < len(node.args) and not argument.kwarg_only:
            value = node.args[position]
        elif argument.name in node.kwargs:
            value = node.kwargs[argument.name]
        elif argument.has_default_value():
            value = argument.default_value
        else:
            raise AotpackError(f"node '{node.name}' ({node.target}) lacks argument '{argument.name}'")
        found.append((argument, value))
    return found


def argument(node, schema_arg, value, resolve: Callable, strided: Callable, as_tensor: Callable) -> ExternArg:
    """One normalised argument.

    Args:
        resolve: FX node -> lowered value (other objects pass through).
        strided: lowered value -> (base, sizes, strides, offset), realising it if needed.
        as_tensor: Python number -> 0-d constant value, for a number where the schema
            wants a Tensor (``aten.mul.Tensor(x, 2)``; the boxed call needs a tensor).

    Raises:
        AotpackError: an argument type the runtime cannot pass (names node and argument).
    """
    type_ = schema_arg.type
    if isinstance(type_, torch._C.OptionalType):
        if value is None:
            return ExternArg("none", None)
        type_ = type_.getElementType()
    text = str(type_)
    value = resolve(value)
    if isinstance(value, (list, tuple)) and text.startswith(("List[Tensor]", "List[Optional[Tensor]]")):
        return ExternArg("tensor_list", [None if v is None else strided(resolve(v)) for v in value])
    if isinstance(value, Value):
        return ExternArg("tensor", strided(value))
    if text == "Tensor" and isinstance(value, (bool, int, float)):
        return ExternArg("tensor", strided(as_tensor(value)))
    if isinstance(value, torch.device):
        return ExternArg("device", str(value))
    for kind_type, kind in _SCALARS:
        if isinstance(value, kind_type):
            return ExternArg(kind, value)
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, bool) for v in value) and "bool" in text:
            return ExternArg("bool_list", [bool(v) for v in value])
        if all(isinstance(v, int) for v in value):
            return ExternArg("int_list", [int(v) for v in value])
        if all(isinstance(v, (int, float)) for v in value):
            return ExternArg("double_list", [float(v) for v in value])
    if value is None:
        return ExternArg("none", None)
    raise AotpackError(f"unsupported argument {schema_arg.name}={value!r} of {node.target} "
                       f"in node '{node.name}'")

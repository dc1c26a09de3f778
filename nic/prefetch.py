"""A software prefetch hint for numba kernels (``llvm.prefetch``).

Walking capture records is pointer chasing: each record header says where the next one
starts, so a plain loop waits on one cache miss per record. Records of a capture mostly
have the same length, so a kernel can guess where the record ``d`` ahead starts and ask
for its header early; a wrong guess costs nothing but a wasted line fetch.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic


@intrinsic
def prefetch(typingctx, arr, idx):  # type: ignore[no-untyped-def]
    """Hint that ``arr[idx]`` will be read soon (no fault, no effect on results). ``idx``
    must lie inside ``arr``: the address is computed without a bounds check."""
    if not isinstance(arr, types.Array) or not isinstance(idx, types.Integer):
        return None
    sig = types.void(arr, idx)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        a, i = args
        ary = context.make_array(signature.args[0])(context, builder, a)
        ptr = builder.gep(ary.data, [i])
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32])
        fn = builder.module.declare_intrinsic("llvm.prefetch", [ptr.type], fnty)
        # read, high temporal locality, data cache
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen

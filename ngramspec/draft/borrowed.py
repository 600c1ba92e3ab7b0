"""``borrowed(array)``: the same array, with no owner, for a compiled call's own arguments.

Numba counts references to every array it holds with atomic operations, and it takes a
reference to each array argument of every function it inlines (``inline="always"``), released
where the body ends. Its pruning pass removes such pairs in small functions, not in a body as
large as a vLLM step's row (:func:`~ngramspec.vllm.kernels.propose_rows`: spot checks, extend,
candidates, draft): there every row took 56 references (counted with a debugger), which
``perf`` put at a third of the compiled step's time at 16 rows. A view with no owner (no
``meminfo``) makes each of them a test of a null pointer: that step ran 17% faster.

Safe only where the array outlives every use of the view: a compiled call's argument, held by
its caller until the call returns, and never stored in a container that outlives the call.
"""

from __future__ import annotations

from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def borrowed(typingctx, array):
    """``array`` as a view with no owner (see the module doc), of the same type."""
    if not isinstance(array, types.Array):
        return None

    def codegen(context, builder, signature, args):
        source = context.make_array(array)(context, builder, value=args[0])
        view = context.make_array(array)(context, builder)
        for field in ("nitems", "itemsize", "data", "shape", "strides"):
            setattr(view, field, getattr(source, field))
        view.meminfo = cgutils.get_null_value(view.meminfo.type)
        view.parent = cgutils.get_null_value(view.parent.type)
        return view._getvalue()

    return array(array), codegen

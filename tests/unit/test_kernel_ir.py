"""Fusion decisions read from the printed kernel IR, without a compiler."""
import textwrap


from aotpack import backends
from aotpack.ir import gemm
from aotpack.frontend.export import export_model, load_model_file
from aotpack.ir.kernel import FusedKernel, Reduce, walk
from aotpack.ir.template_kernels import GemmKernel
from aotpack.lower.lowering import lower
from helpers import SAMPLES



def lowered(path):
    return lower(export_model(load_model_file(path)), backends.get("cpu"))


def lowered_source(tmp_path, body: str, inputs: str):
    forward = "\n".join("        " + line for line in body.splitlines())
    path = tmp_path / "m.py"
    path.write_text(f"import torch\n\n\nclass M(torch.nn.Module):\n    def forward(self, x):\n{forward}\n\n\n"
                    f"def model():\n    return M()\n\n\ndef example_inputs():\n    return ({inputs},)\n")
    return lowered(path)


def fused(graph) -> list:
    """The graph's fused kernels (the GEMM template kernels of its linears left out)."""
    return [k for k in graph.kernels if isinstance(k, FusedKernel)]


def reductions(kernel):
    """Kinds of the distinct reductions a kernel computes, sorted."""
    found = {n for e in kernel.exprs for n in walk(e) if isinstance(n, Reduce)}
    return sorted(n.kind for n in found)


def test_mlp_fuses_gelu_and_layer_norm_into_one_kernel_each():
    graph = lowered(SAMPLES / "mlp.py")
    gelu, norm = fused(graph)
    assert [k.name for k in fused(graph)] == ["fused_mul_erf_add_2", "fused_var_mean_sub_add_rsqrt_mul_3"]
    # each linear also offers aotpack's GEMM template, its epilogue in the kernel
    assert [(k.name, k.m, k.k, k.n, k.epilogue) for k in graph.kernels if isinstance(k, GemmKernel)] == [
        ("gemm_gelu_1", 32, 512, 2048, "gelu"), ("gemm_none_3", 32, 2048, 512, "none")]
    assert str(gelu) == textwrap.dedent("""\
        kernel fused_mul_erf_add_2 [i0<32, j<2048]
          in0: float32[32, 2048] strides [2048, 1]
          %1: float32 = load in0[2048 * i0 + j]
          %2: float32 = mul(%1, 0.5:float32)
          %3: float32 = mul(%1, 0.7071067811865476:float32)
          %4: float32 = erf(%3)
          %5: float32 = add(%4, 1:float32)
          %6: float32 = mul(%2, %5)
          out0: float32[32, 2048] = %6""")
    assert reductions(gelu) == [] and not gelu.has_reduction
    # layer_norm = one row kernel: mean and variance per row, weight and bias loaded along j
    assert reductions(norm) == ["sum", "sum"] and norm.has_reduction
    assert "rows (i0)" in str(norm) and "load in1[j]" in str(norm) and "load in2[j]" in str(norm)


def test_transformer_block_kernels_and_their_structure():
    graph = lowered(SAMPLES / "transformer_block.py")
    names = [k.name for k in fused(graph)]
    # fused_add_11 / fused_add_16: the residual adds, epilogues of the proj/fc2 GEMM steps (their
    # ATen variant); ln2 then reads a buffer laid out like ln1's input: one kernel_id for both
    assert names == ["fused_var_mean_sub_add_rsqrt_mul_1", "fused_clone_3", "fused_clone_4",
                     "fused_div_amax_sub_exp_sum_6", "fused_clone_7", "fused_clone_9", "fused_add_11",
                     "fused_var_mean_sub_add_rsqrt_mul_12", "fused_mul_erf_add_14", "fused_add_16"]
    by_name = {k.name: k for k in graph.kernels}
    softmax = by_name["fused_div_amax_sub_exp_sum_6"]  # softmax(q k^T / 8): one row kernel
    assert reductions(softmax) == ["max", "sum"]
    assert (softmax.outer_shape, softmax.inner_size) == ((4, 4, 128), 128)
    assert by_name["fused_clone_4"].access.strided  # k^T: a transposing copy, strided along j
    assert not by_name["fused_clone_3"].access.strided
    assert "kernel_id" in graph.dump() and graph.dump().count("\nkernel ") == 8


def test_reduction_read_across_rows_gets_its_own_kernel(tmp_path):
    graph = lowered_source(tmp_path, "s = x.amax(-1)\nreturn x.t() * s", "torch.randn(8, 16)")
    first, second = graph.kernels
    assert reductions(first) == ["max"] and first.row_outputs == (0,)
    assert reductions(second) == []
    assert second.inputs[1] is first.outputs[0]  # the product reads the realised maxima


def test_identical_kernels_share_one_kernel_id(tmp_path):
    graph = lowered_source(tmp_path, "a = torch.relu(x) * 2\nb = torch.relu(x + 1) * 2\nreturn a, b",
                           "torch.randn(8, 16)")
    assert len(graph.kernels) == 2
    assert graph.kernels[0].kernel_id != graph.kernels[1].kernel_id
    # the same op chain on two buffers of one layout (repeated layers): one kernel, two launches
    twice = gemm.resolve(lowered_source(tmp_path, "y = x.matmul(x)\nreturn torch.relu(x) * 2, torch.relu(y) * 2",
                                        "torch.randn(8, 8)"), {})  # the matmul as its ATen variant
    ids = [k.kernel_id for k in twice.kernels]
    assert len(ids) == 2 and ids[0] == ids[1] and len(twice.distinct_kernels()) == 1


def test_narrow_inner_dimension_merges_into_one_long_loop(tmp_path):
    graph = lowered_source(tmp_path, "return torch.sigmoid(x) + 1", "torch.randn(1000, 3)")
    (kernel,) = graph.kernels
    assert (kernel.outer_shape, kernel.inner_size) == ((), 3000)

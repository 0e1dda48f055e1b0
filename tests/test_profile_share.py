"""experiments/profile_share.py: the share of a profiled step's device time in matmuls, cuDNN attention and the
rest, read from jax.profiler's xplane.pb (CPU traces here; the bench's own trace in tests/test_bench.py)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from cli_modules import cli_module

profile_share = cli_module("profile_share")
from transformer.spec import MissingInputError

# A compiled module's HLO text as XLA prints it (shapes, tuple shapes with index comments, fusions calling
# computations, custom-calls by target), cut to what the classification reads.
HLO = """HloModule jit_step, entry_computation_layout={(f32[8,8]{1,0})->f32[8,8]{1,0}}

%fused_dot (param_0: f32[8,8], param_1: f32[8,8]) -> f32[8,8] {
  %param_0 = f32[8,8]{1,0} parameter(0)
  %param_1 = f32[8,8]{1,0} parameter(1)
  %dot.1 = f32[8,8]{1,0} dot(%param_0, %param_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %tanh.1 = f32[8,8]{1,0} tanh(%dot.1)
}

%fused_reduce (param_0.2: f32[8,8]) -> f32[8] {
  %param_0.2 = f32[8,8]{1,0} parameter(0)
  %constant.1 = f32[] constant(0)
  ROOT %reduce.1 = f32[8]{0} reduce(%param_0.2, %constant.1), dimensions={1}, to_apply=%add
}

%fused_attention (p.0: bf16[1,8,2,4]) -> bf16[1,8,2,4] {
  %p.0 = bf16[1,8,2,4]{3,2,1,0} parameter(0)
  ROOT %cudnn-fmha.1 = (bf16[1,8,2,4]{3,2,1,0}, u8[0]{0}) custom-call(%p.0, %p.0, %p.0), custom_call_target="__cudnn$fmhaSoftmax"
}

%body (arg: (s32[], f32[8,8])) -> (s32[], f32[8,8]) {
  %arg = (s32[], f32[8,8]{1,0}) parameter(0)
  ROOT %tuple.9 = (s32[], f32[8,8]{1,0}) tuple(%arg)
}

ENTRY %main.10 (Arg_0.1: f32[8,8]) -> f32[8,8] {
  %Arg_0.1 = f32[8,8]{1,0} parameter(0)
  %matmul_fusion = f32[8,8]{1,0} fusion(%Arg_0.1, %Arg_0.1), kind=kOutput, calls=%fused_dot
  %ynn_fusion.3 = f32[8]{0} fusion(%matmul_fusion), kind=kCustom, calls=%fused_reduce, backend_config={"fusion_config":{"kind":"__ynn_fusion"}}
  %cublas-gemm.2 = (f32[8,8]{1,0}, s8[4194304]{0}) custom-call(%Arg_0.1, %Arg_0.1), custom_call_target="__cublas$gemm"
  %attention_fusion = (bf16[1,8,2,4]{3,2,1,0}, /*index=1*/u8[0]{0}) fusion(%Arg_0.1), kind=kCustom, calls=%fused_attention
  %while.4 = (s32[], f32[8,8]{1,0}) while(%tuple.9), condition=%cond, body=%body
  %copy.5 = f32[8,8]{1,0} copy(%Arg_0.1)
  ROOT %convolution.6 = f32[8,8]{1,0} convolution(%copy.5, %copy.5), dim_labels=bf_io->bf
}
"""


def test_hlo_classification_by_hand():
    module, categories = profile_share.hlo_categories(HLO)
    assert module == "jit_step"
    assert categories["matmul_fusion"] == "matmul"  # a dot with its fused epilogue
    assert categories["ynn_fusion.3"] == "other"  # a YNNPACK fusion holding a reduction, not a dot
    assert categories["cublas-gemm.2"] == "matmul"
    assert categories["attention_fusion"] == "attention"
    assert categories["cudnn-fmha.1"] == "attention"
    assert categories["while.4"] == "control"  # its body's instructions have events of their own
    assert categories["copy.5"] == "other" and categories["convolution.6"] == "matmul"


@pytest.mark.parametrize("op, kernel, category", [
    ("dot.60", "dot.60", "matmul"),
    ("fusion.12", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matmul"),
    ("gemm_fusion_dot.3", "gemm_fusion_dot_3", "matmul"),
    ("custom-call.7", "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3", "attention"),
    ("loop_add_fusion", "loop_add_fusion", "other"),
    ("ynn_fusion.8", "ynn_fusion.8", "other"),  # names alone cannot tell a YNNPACK dot from a reduction
    ("while.44", "while.44", "control"),
])
def test_classification_by_name(op, kernel, category):
    assert profile_share.name_category(op, kernel) == category


def _profile(fn, args, trace_dir, steps: int = 3) -> dict:
    compiled = jax.jit(fn).lower(*args).compile()
    jax.block_until_ready(compiled(*args))
    with jax.profiler.trace(str(trace_dir)):
        for _ in range(steps):
            out = compiled(*args)
        jax.block_until_ready(out)
    profile_share.save_hlo(compiled, str(trace_dir))
    return profile_share.summarize(str(trace_dir))


def test_known_workloads_on_the_cpu(tmp_path):
    """Programs on one CPU device whose kind of work is known: matmuls only (plain, and in a scan like scanned
    layers), a sort only, and both. The trace's instructions are found, classified by the HLO text, and timed;
    a loop's own event, which spans its body's, is not counted again."""
    x = jax.random.normal(jax.random.PRNGKey(0), (384, 384))
    ys = jax.random.normal(jax.random.PRNGKey(1), (100, 384))  # sorting it takes about as long as the dots
    matmuls = _profile(lambda a: (a @ a) @ a, (x,), tmp_path / "matmul")
    sort = _profile(lambda b: jnp.sort(b, axis=0), (ys,), tmp_path / "sort")
    both = _profile(lambda a, b: ((a @ a) @ a, jnp.sort(b, axis=0)), (x, ys), tmp_path / "both")
    scanned = _profile(lambda a: jax.lax.scan(lambda c, _: ((c @ a) @ a, None), a, None, length=4)[0], (x,),
                       tmp_path / "scan")
    for s in (matmuls, scanned, sort, both):
        assert s["classified_by"] == "hlo" and s["module"].startswith("jit_")
        assert sum(s["share"].values()) == pytest.approx(1.0)
        assert 0 < s["busy_seconds"] <= s["span_seconds"]
        assert s["share"]["attention"] == 0.0
    assert matmuls["share"]["matmul"] > 0.9  # nothing but two dots (and at most a copy)
    assert scanned["share"]["matmul"] > 0.9  # the while loop's own event would make it about half
    assert sort["share"]["matmul"] == 0.0 and sort["top_other"][0][0].startswith("sort")
    assert 0.05 < both["share"]["matmul"] < 0.95
    assert any(name.startswith("sort") for name, _, _ in both["top_other"])


def test_no_trace_is_a_missing_input(tmp_path):
    with pytest.raises(MissingInputError, match="no jax.profiler trace"):
        profile_share.summarize(str(tmp_path))

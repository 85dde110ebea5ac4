"""tritonlab.sparse_ffn: the fixed-slice dX kernel against float64, the layer's gradients against
autograd through the sliced reference, and BERT/RoBERTa with their FFN layers replaced.

The sliced backward is numerically wrong for training by design; these tests check that it computes
exactly that wrong thing (dX of the first n_rows rows, zeros after) and nothing else."""

import copy
import json

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from tritonlab.sparse_ffn import SlicedBackwardLinear, fixed_slice_matmul, replace_ffn, sliced_backward_linear
from tritonlab.testing import (
    check_against_float64,
    poisoned_empty,
    rel_err,
    run_without_interpreter,
    triton_tools_missing,
)
from tritonlab.tuning import HOPPER_SHARED_MEMORY

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def sliced_reference(dy: torch.Tensor, w: torch.Tensor, n_rows: int) -> torch.Tensor:
    dx = torch.zeros(dy.shape[0], w.shape[1], dtype=torch.float64, device=dy.device)
    dx[:n_rows] = dy[:n_rows].double() @ w.double()
    return dx


def make(shape, dtype, seed):
    g = torch.Generator(DEVICE).manual_seed(seed)
    return torch.randn(shape, generator=g, device=DEVICE, dtype=torch.float32).to(dtype)


# --- the kernel -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("T", "K", "D"), [(45, 37, 53), (70, 24, 33), (33, 65, 8)])
@pytest.mark.parametrize("which", ["zero", "one", "all", "all-1", "middle"])
def test_kernel_against_float64_with_exact_zeros_past_the_slice(dtype, T, K, D, which):
    n_rows = {"zero": 0, "one": 1, "all": T, "all-1": T - 1, "middle": T // 2 + 3}[which]
    dy, w = make((T, K), dtype, 0), make((K, D), dtype, 1)
    with poisoned_empty():
        dx = fixed_slice_matmul(dy, w, n_rows)
    assert dx.shape == (T, D) and dx.dtype == dtype
    assert torch.isfinite(dx).all()
    assert (dx[n_rows:] == 0).all()
    ref = sliced_reference(dy, w, n_rows)
    if n_rows:
        assert rel_err(dx[:n_rows], ref[:n_rows]) < TOL[dtype]


@pytest.mark.parametrize(("T", "K", "D"), [(45, 40, 24), (70, 16, 56), (1, 8, 8)])
@pytest.mark.parametrize("which", ["one", "all", "all-1", "middle"])
def test_tma_kernel_against_float64_with_exact_zeros_past_the_slice(T, K, D, which):
    """The descriptor kernel (persistent in the interpreter: 4 programs walk every output tile):
    dy's descriptor spans the slice, so the straddling block and the tiles past it store zeros."""
    n_rows = {"one": 1, "all": T, "all-1": max(T - 1, 1), "middle": T // 2 + 1}[which]
    dy, w = make((T, K), torch.float16, 0), make((K, D), torch.float16, 1)
    with poisoned_empty():
        dx = fixed_slice_matmul(dy, w, n_rows, impl="tma")
    assert (dx[n_rows:] == 0).all()
    assert rel_err(dx[:n_rows], sliced_reference(dy, w, n_rows)[:n_rows]) < TOL[torch.float16]


@pytest.mark.parametrize(
    ("T", "K", "D", "n_rows"), [(45, 200, 24, 20), (45, 200, 24, 45), (9, 200, 40, 1), (70, 160, 56, 69), (1, 96, 8, 1)]
)  # fmt: skip
def test_short_kernel_against_float64_with_exact_zeros_past_the_slice(T, K, D, n_rows):
    """The short-slice kernel: a program a tile of the slice (the straddling block reads zeros past it
    through dy's descriptor), the programs after them store the zero tiles past the slice."""
    dy, w = make((T, K), torch.float16, 0), make((K, D), torch.float16, 1)
    with poisoned_empty():
        dx = fixed_slice_matmul(dy, w, n_rows, impl="short")
    assert (dx[n_rows:] == 0).all()
    assert rel_err(dx[:n_rows], sliced_reference(dy, w, n_rows)[:n_rows]) < TOL[torch.float16]


def test_impl_chooses_the_kernel():
    from tritonlab.tuning import ConfigRecord

    dy, w = make((40, 16), torch.float16, 0), make((16, 24), torch.float16, 1)
    picked = {}
    for impl in ("tma", "pointer", "auto"):
        record = ConfigRecord()
        dx = fixed_slice_matmul(dy, w, 20, impl=impl, record=record)
        assert rel_err(dx[:20], sliced_reference(dy, w, 20)[:20]) < TOL[torch.float16]
        picked[impl] = record.picked["fixed_slice_matmul"]
    assert "PERSISTENT" in picked["tma"] and "PERSISTENT" not in picked["pointer"]
    # a slice of one 128 x 128 tile: the short-slice kernel on Hopper, the pointer kernel elsewhere
    on_hopper = DEVICE.type == "cuda" and torch.cuda.get_device_capability()[0] >= 9
    assert picked["auto"].startswith("short:") == on_hopper, picked
    assert "PERSISTENT" not in picked["auto"]


def test_tma_kernel_refuses_what_a_descriptor_cannot_address():
    dy, w = make((10, 16), torch.float16, 0), make((16, 8), torch.float16, 1)
    for call in [
        lambda: fixed_slice_matmul(dy.float(), w.float(), 3, impl="tma"),  # float32
        lambda: fixed_slice_matmul(dy, w, 0, impl="tma"),  # an empty slice
        lambda: fixed_slice_matmul(make((10, 15), torch.float16, 2), w[:15], 3, impl="tma"),  # 30-byte rows
        lambda: fixed_slice_matmul(dy, w[:, :7], 3, impl="tma"),  # 14-byte rows of dx
        lambda: fixed_slice_matmul(dy, w, 0, impl="short"),  # the short kernel reads dy by descriptor too
        lambda: fixed_slice_matmul(dy.float(), w.float(), 3, impl="short"),
    ]:
        with pytest.raises(ValueError, match="impl"):
            call()
    with pytest.raises(ValueError, match="impl"):
        fixed_slice_matmul(dy, w, 3, impl="cutlass")
    # "auto" falls back to the pointer kernel where the descriptor cannot go
    assert rel_err(fixed_slice_matmul(dy, w[:, :7], 3)[:3], sliced_reference(dy, w[:, :7], 3)[:3]) < 2e-3


def test_kernel_takes_strided_views_and_empty_shapes():
    base_dy, base_w = make((40, 60), torch.float32, 2), make((50, 30), torch.float32, 3)
    dy, w = base_dy[:, ::2], base_w.t()[::1, :]  # dy (40, 30) with column stride 2; w (30, 50) transposed
    dx = fixed_slice_matmul(dy, w, 17)
    assert rel_err(dx, sliced_reference(dy, w, 17)) < 1e-5
    assert fixed_slice_matmul(make((0, 8), torch.float32, 0), make((8, 5), torch.float32, 0), 0).shape == (
        0,
        5,
    )
    zeros_k = fixed_slice_matmul(make((6, 0), torch.float32, 0), make((0, 5), torch.float32, 0), 3)
    assert (zeros_k == 0).all() and zeros_k.shape == (6, 5)


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda dy, w: fixed_slice_matmul(dy, w, -1), "n_rows"),
        (lambda dy, w: fixed_slice_matmul(dy, w, 11), "n_rows"),
        (lambda dy, w: fixed_slice_matmul(dy, w, 2.0), "n_rows"),
        (lambda dy, w: fixed_slice_matmul(dy, w, True), "n_rows"),
        (lambda dy, w: fixed_slice_matmul(dy, w[:7], 3), "w"),
        (lambda dy, w: fixed_slice_matmul(dy, w.half(), 3), "w"),
        (lambda dy, w: fixed_slice_matmul(dy[None], w, 3), "dy"),
        (lambda dy, w: fixed_slice_matmul(dy.double(), w.double(), 3), "dy"),
        (lambda dy, w: fixed_slice_matmul(dy, w.to("meta"), 3), "w"),
        (lambda dy, w: fixed_slice_matmul(dy.tolist(), w, 3), "dy"),
    ],
)
def test_bad_kernel_inputs_name_the_argument(call, argument):
    dy, w = make((10, 8), torch.float32, 0), make((8, 6), torch.float32, 1)
    with pytest.raises(ValueError, match=f"^{argument}:"):
        call(dy, w)


# --- the layer ------------------------------------------------------------------------------------


def reference_layer(n_rows):
    """y = x Wᵀ + b whose autograd gives dX only through the first n_rows flattened rows, dW and db
    from all of dY: the sliced backward, written with torch's own operations."""

    def layer(x, w, b):
        rows = x.reshape(-1, x.shape[-1])
        sliced = torch.cat([rows[:n_rows], rows[n_rows:].detach()]).reshape(x.shape)
        return F.linear(sliced, w.detach()) + F.linear(x.detach(), w, b) - F.linear(x.detach(), w.detach())

    return layer


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n_rows", [0, 1, 9, 20, 21])
def test_layer_grads_against_autograd_through_the_sliced_reference(dtype, n_rows):
    x, w, b = make((3, 7, 40), dtype, 0), make((24, 40), dtype, 1), make((24,), dtype, 2)
    dy = make((3, 7, 24), dtype, 3)
    check_against_float64(
        lambda x, w, b: sliced_backward_linear(x, w, b, n_rows),
        reference_layer(n_rows),
        [x, w, b],
        dy,
        tol=TOL[dtype] * 2,
        names=["y", "dx", "dw", "db"],
    )


def test_module_shares_the_parameters_and_forwards_exactly():
    torch.manual_seed(0)
    linear = nn.Linear(16, 12).to(DEVICE)
    sliced = SlicedBackwardLinear.from_linear(linear, 5)
    assert sliced.weight is linear.weight and sliced.bias is linear.bias
    assert isinstance(sliced, nn.Linear) and "n_rows=5" in repr(sliced)
    x = make((2, 4, 16), torch.float32, 0).requires_grad_()
    assert torch.equal(sliced(x), linear(x))
    sliced(x).square().sum().backward()
    assert (x.grad.reshape(-1, 16)[5:] == 0).all() and (x.grad.reshape(-1, 16)[:5] != 0).any()
    with pytest.raises(ValueError, match="^n_rows:"):
        SlicedBackwardLinear.from_linear(linear, 9)(x).sum().backward()
    with pytest.raises(ValueError, match="^n_rows:"):
        SlicedBackwardLinear.from_linear(linear, -2)


# --- BERT and RoBERTa -----------------------------------------------------------------------------


def tiny_model(kind: str):
    transformers = pytest.importorskip("transformers")
    config_cls, model_cls = {
        "bert": (transformers.BertConfig, transformers.BertForSequenceClassification),
        "roberta": (transformers.RobertaConfig, transformers.RobertaForSequenceClassification),
    }[kind]
    config = config_cls(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=48,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=2,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return model_cls(config).to(DEVICE).train()


def batch(model, B=2, S=9):
    g = torch.Generator(DEVICE).manual_seed(1)
    ids = torch.randint(5, model.config.vocab_size, (B, S), generator=g, device=DEVICE)
    return {"input_ids": ids, "labels": torch.tensor([0, 1], device=DEVICE)[:B]}


@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_replaced_model_forwards_exactly_and_with_all_rows_gets_the_same_grads(kind):
    original = tiny_model(kind)
    replaced = replace_ffn(copy.deepcopy(original), n_rows=2 * 9)
    for layer in replaced.base_model.encoder.layer:
        assert isinstance(layer.intermediate.dense, SlicedBackwardLinear)
        assert isinstance(layer.output.dense, SlicedBackwardLinear)
    inputs = batch(original)
    out_o, out_r = original(**inputs), replaced(**inputs)
    assert torch.equal(out_o.logits, out_r.logits) and torch.equal(out_o.loss, out_r.loss)
    out_o.loss.backward()
    out_r.loss.backward()
    for (name, p_o), p_r in zip(original.named_parameters(), replaced.parameters(), strict=True):
        assert p_r.grad is not None, name
        assert rel_err(p_r.grad, p_o.grad, scale=1e-6) < 1e-4, name


@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_a_partial_slice_zeroes_the_ffn_input_grads_past_it(kind):
    original = tiny_model(kind)
    replaced = replace_ffn(copy.deepcopy(original), n_rows=4, layers=[1])
    first, second = replaced.base_model.encoder.layer
    assert type(first.output.dense) is nn.Linear and second.output.dense.n_rows == 4
    seen = {}
    second.output.dense.register_full_backward_hook(lambda m, gi, go: seen.update(dx=gi[0]))
    out = replaced(**batch(replaced))
    assert torch.equal(out.logits, original(**batch(original)).logits)
    out.loss.backward()
    dx = seen["dx"].reshape(-1, seen["dx"].shape[-1])
    assert (dx[4:] == 0).all() and (dx[:4] != 0).any()


def test_replace_ffn_refuses_other_models_bad_layers_and_bad_n_rows():
    transformers = pytest.importorskip("transformers")
    model = tiny_model("bert")
    with pytest.raises(ValueError, match="^layers:.*out of range"):
        replace_ffn(model, 3, layers=[0, 2])
    with pytest.raises(ValueError, match="^layers:.*out of range"):
        replace_ffn(model, 3, layers=-1)
    with pytest.raises(ValueError, match="^layers:"):
        replace_ffn(model, 3, layers=["0"])
    with pytest.raises(ValueError, match="^n_rows:"):
        replace_ffn(model, -1)
    gpt2 = transformers.GPT2Model(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50))
    with pytest.raises(ValueError, match="^model:.*GPT2Config"):
        replace_ffn(gpt2, 3)
    with pytest.raises(ValueError, match="^model:"):
        replace_ffn(nn.Linear(4, 4), 3)
    assert type(model.base_model.encoder.layer[0].output.dense) is nn.Linear  # nothing was replaced


# The sm_90a builds of a descriptor kernel's tiles (argv[1]: "tma" or "short"): shared memory, the
# pruner's estimate of it and ptxas's report, per tile.
_DESCRIPTOR_BUILD = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tritonlab import sparse_ffn
from tritonlab.tuning import ptxas_report

if sys.argv[1] == "tma":
    kernel, smem = sparse_ffn._fixed_slice_matmul_tma_kernel, sparse_ffn._tma_smem
    tiles = [(m, n, k, w, s, {"PERSISTENT": p, "FLATTEN": f}) for m, n, k, w, s, p, f in sparse_ffn._TMA_TILES]
else:
    kernel, smem = sparse_ffn._fixed_slice_matmul_short_kernel, sparse_ffn._smem
    tiles = [(*tile, {}) for tile in sparse_ffn._SHORT_TILES]
results = []
for m, n, k, w, s, flags in tiles:
    sig = {"dy_desc": f"tensordesc<bf16[{m}, {k}]>", "w_desc": f"tensordesc<bf16[{k}, {n}]>",
           "dx_desc": f"tensordesc<bf16[{m}, {n}]>", "T": "i32", "N_ROWS": "i32", "K": "i32", "D": "i32"}
    consts = {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8, **flags}
    sig.update({name: "constexpr" for name in consts})
    out = triton.compile(ASTSource(kernel, sig, consts),
                         target=GPUTarget("cuda", 90, 32), options={"num_warps": w, "num_stages": s})
    config = sparse_ffn._descriptor_config(m, n, k, w, s, **flags)
    results.append({"tile": [m, n, k, w, s], "shared": out.metadata.shared,
                    "estimate": smem(config, 2), **ptxas_report(out.asm["ptx"], "sm_90a")})
print(json.dumps(results))
"""


def _descriptor_builds(kernel: str) -> list[dict]:
    return json.loads(run_without_interpreter(_DESCRIPTOR_BUILD, kernel).stdout.strip().splitlines()[-1])


def _assert_fit_as_estimated_without_spills(results: list[dict]) -> None:
    for r in results:
        assert (
            r["shared"] <= HOPPER_SHARED_MEMORY and abs(r["shared"] - r["estimate"]) <= 0.001 * r["shared"]
        ), r
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0, r


@pytest.mark.skipif(triton_tools_missing("ptxas"), reason="needs Triton's ptxas")
def test_every_tma_tile_builds_for_hopper_within_its_shared_memory_and_without_spills():
    """The TMA kernel's sm_90a builds, compiled on the CPU: each fits Hopper's 227 KB of shared memory
    a block, the pruner's estimate is the build's to 0.1%, and nothing spills."""
    results = _descriptor_builds("tma")
    assert len(results) == 6
    _assert_fit_as_estimated_without_spills(results)


@pytest.mark.skipif(triton_tools_missing("ptxas"), reason="needs Triton's ptxas")
def test_every_short_tile_builds_for_hopper_within_its_shared_memory_and_without_spills():
    """The short-slice kernel's sm_90a builds: the pipelined input tiles are its shared memory (the
    epilogue reuses them), as the pruner estimates to 0.1%; nothing spills."""
    results = _descriptor_builds("short")
    assert len(results) == 8
    _assert_fit_as_estimated_without_spills(results)


_GLUON_BUILD = r"""
import json, re
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import mangle_type
from tritonlab import sparse_ffn as s
from tritonlab._gluon import block_descriptor
from tritonlab.tuning import ptxas_report, sass_fingerprint

dy, w, dx = (torch.empty(shape, dtype=torch.bfloat16) for shape in [(256, 256), (256, 384), (256, 384)])
descriptors = [block_descriptor(dy, (s._WS_ROWS, s._WS_BLOCK_K)), block_descriptor(w, (s._WS_BLOCK_K, s._WS_BLOCK_N)),
               block_descriptor(dx, (s._WS_ROWS, s._WS_BLOCK_N // 2))]
sig = {name: mangle_type(d) for name, d in zip(["a_desc", "b_desc", "c_desc"], descriptors)}
sig.update({"T": "i32", "N_ROWS": "i32", "K": "i32", "D": "i32", "STAGES": "constexpr"})
out = triton.compile(GluonASTSource(s._fixed_slice_matmul_ws_kernel, sig, {"STAGES": s._WS_STAGES}),
                     target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
ptx = out.asm["ptx"]
print(json.dumps({"shared": out.metadata.shared, "warps": out.metadata.num_warps, **ptxas_report(ptx, "sm_90a"),
                  "wgmma": sorted(set(re.findall(r"wgmma\.mma_async\S*", ptx))), **sass_fingerprint(ptx, "sm_90a")}))
"""


# The fingerprint (tuning.sass_fingerprint) of the build the report's newest rows time (f2ff371; the
# same today). A source change that leaves the output alone can still move ptxas' schedule (the FP8
# attention forward once lost 1.19x so, phase 05's README): a new fingerprint replaces this one only
# with a timing of its build against the old one committed beside.
TIMED_BUILD = "60ab41f10110dae8"


@pytest.mark.skipif(triton_tools_missing("ptxas", "cuobjdump"), reason="needs Triton's ptxas and cuobjdump")
def test_the_gluon_kernel_builds_for_hopper_warp_specialised_within_its_shared_memory():
    """Three MMA warpgroups and a load warp (16 warps, padded), bf16 wgmma 64 x 128, the 5-deep ring
    within Hopper's shared memory (the store staged in it), no spills."""
    r = json.loads(run_without_interpreter(_GLUON_BUILD).stdout.strip().splitlines()[-1])
    assert r["warps"] == 16, r
    assert r["shared"] <= HOPPER_SHARED_MEMORY, r
    assert r["wgmma"] and all("m64n128k16.f32.bf16.bf16" in x for x in r["wgmma"]), r
    assert r["spill_stores"] == 0 and r["spill_loads"] == 0, r
    assert r["sass_sha"] == TIMED_BUILD, "the sm_90a build changed; time it (see TIMED_BUILD)"


def test_the_gluon_kernel_is_refused_where_it_cannot_run():
    dy, w = make((10, 16), torch.float16, 0), make((16, 8), torch.float16, 1)
    hopper = DEVICE.type == "cuda" and torch.cuda.get_device_capability()[0] == 9
    calls = [lambda: fixed_slice_matmul(dy, w, 0, impl="gluon")]  # an empty slice: no descriptor
    if not hopper:
        calls.append(lambda: fixed_slice_matmul(dy, w, 3, impl="gluon"))  # the interpreter, or no Hopper
    for call in calls:
        with pytest.raises(ValueError, match="^impl: 'gluon'"):
            call()


# --- on a GPU: bf16 at BERT-base shapes -----------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("T", "K", "D", "n_rows"),
    [(4096, 3072, 768, 4096), (4101, 3072, 768, 4100), (1001, 264, 136, 1), (1001, 264, 136, 500),
     (1001, 264, 136, 1001), (200, 8, 8, 193), (4101, 768, 3072, 2050)],
)  # fmt: skip
def test_gpu_gluon_kernel_against_float64_with_exact_zeros_past_the_slice(dtype, T, K, D, n_rows):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon kernel runs on Hopper")
    dy, w = make((T, K), dtype, 0), make((K, D), dtype, 1)
    with poisoned_empty():
        dx = fixed_slice_matmul(dy, w, n_rows, impl="gluon")
    assert (dx[n_rows:] == 0).all()
    assert rel_err(dx[:n_rows], sliced_reference(dy, w, n_rows)[:n_rows]) < TOL[dtype]


@pytest.mark.gpu
def test_gpu_auto_takes_gluon_over_a_long_k_and_the_short_kernel_for_a_short_slice():
    from tritonlab._runtime import sm_count
    from tritonlab.tuning import ConfigRecord

    if torch.cuda.get_device_capability()[0] != 9 or sm_count() < 132:
        pytest.skip("an H100/H200: 132 SMs")
    dy, w = make((4096, 3072), torch.bfloat16, 0), make((3072, 768), torch.bfloat16, 1)
    # 192 x 128 tiles of the slice: 132 (one wave), 66 (0.5 waves: the short kernel, with 96 tiles of
    # 128 x 128, 48 at N = 1 024); over K = 768 never Gluon
    for n_rows, kernel in [
        (4096, "gluon:"),
        (2048, "short:"),
        (1024, "short:"),
    ]:
        record = ConfigRecord()
        fixed_slice_matmul(dy, w, n_rows, record=record)
        assert record.picked["fixed_slice_matmul"].startswith(kernel), (n_rows, record.picked)
    record = ConfigRecord()
    fixed_slice_matmul(dy[:, :768], w[:768], 4096, record=record)
    assert not record.picked["fixed_slice_matmul"].startswith("gluon:"), record.picked


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(("K", "D"), [(3072, 768), (768, 3072)])
@pytest.mark.parametrize("fraction", [0, 1 / 8, 1 / 2, 1])
@pytest.mark.parametrize("impl", ["auto", "pointer", "short"])
def test_gpu_kernel_at_bert_base_shapes(dtype, K, D, fraction, impl):
    T = 32 * 128 + 5  # a ragged last row block
    n_rows = int(T * fraction)
    if impl == "short" and (dtype == torch.float32 or n_rows == 0):
        pytest.skip("the short kernel takes 16-bit operands and a slice that is not empty")
    dy, w = make((T, K), dtype, 0), make((K, D), dtype, 1)
    with poisoned_empty():
        dx = fixed_slice_matmul(dy, w, n_rows, impl=impl)
    assert (dx[n_rows:] == 0).all()
    if n_rows:
        assert rel_err(dx[:n_rows], sliced_reference(dy, w, n_rows)[:n_rows]) < TOL[dtype]
        cublas = dy[:n_rows] @ w
        assert rel_err(dx[:n_rows], cublas) < TOL[dtype]


@pytest.mark.gpu
def test_gpu_bf16_layer_grads_against_the_sliced_reference():
    dtype = torch.bfloat16
    x, w, b = make((8, 512, 768), dtype, 0), make((3072, 768), dtype, 1), make((3072,), dtype, 2)
    check_against_float64(
        lambda x, w, b: sliced_backward_linear(x, w, b, 1000),
        reference_layer(1000),
        [x, w, b],
        make((8, 512, 3072), dtype, 3),
        tol=2e-2,
        names=["y", "dx", "dw", "db"],
    )


def test_kernel_is_keyed_in_the_config_tables_by_power_of_two_rows_and_n():
    """Registered with the tables; row counts and N in one power-of-two bucket share a table key, so a
    new batch or N in a tuned bucket launches the bucket's pick untimed (the mechanism itself is
    tested in tests/tritonlab/test_tuning_tables.py)."""
    from tritonlab.tuning_tables import TUNER

    kernel = TUNER.kernels["sparse_ffn.fixed_slice_matmul"]
    assert kernel.spec.phase == "sparse_ffn" and kernel.spec.dtype_arg == "dy_ptr"

    def key(T, n_rows):
        return kernel.bucket_key({"T": T, "N_ROWS": n_rows, "K": 768, "D": 3072, "DOT_PRECISION": "tf32"})

    assert key(4000, 3000) == key(4096, 2049) == "T=4096,N_ROWS=4096,K=768,D=3072,DOT_PRECISION=tf32|"
    assert key(4097, 3000) != key(4096, 3000) != key(4096, 2048)

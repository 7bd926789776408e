"""The three selective scans agree, the SSM's recurrence equals its convolution, ZOH is exact."""


import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.mamba import ssm
from course_lib.mamba.scan import (
    associative_scan,
    combine,
    selective_scan_chunked,
    selective_scan_parallel,
    selective_scan_sequential,
)


def inputs(b, L, D, N, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=dtype)
    return (r(b, L, D), F.softplus(r(b, L, D) - 1), -torch.exp(r(D, N) * 0.5), r(b, L, N), r(b, L, N), r(D))


@settings(max_examples=12, deadline=None)
@given(b=st.integers(1, 3), L=st.integers(1, 150), D=st.integers(1, 9), N=st.integers(1, 6),
       chunk=st.integers(1, 40), seed=st.integers(0, 10_000))
def test_scans_agree_float32(b, L, D, N, chunk, seed):
    args = inputs(b, L, D, N, seed)
    y_seq, h_seq = selective_scan_sequential(*args, return_state=True)
    y_par, h_par = selective_scan_parallel(*args, return_state=True)
    y_chk, h_chk = selective_scan_chunked(*args, chunk=chunk, return_state=True)
    for y, h in [(y_par, h_par), (y_chk, h_chk)]:
        torch.testing.assert_close(y, y_seq, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(h, h_seq, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("L", [1, 2, 3, 255, 257, 1000])
def test_scans_agree_at_awkward_lengths(L):
    args = inputs(2, L, 6, 4, seed=L)
    expected = selective_scan_sequential(*[a.double() for a in args])
    for scan in (selective_scan_sequential, selective_scan_parallel, selective_scan_chunked):
        torch.testing.assert_close(scan(*args).double(), expected, rtol=1e-5, atol=1e-5)


def test_scan_gradients_match_float64():
    args = [a.double().requires_grad_() for a in inputs(2, 23, 5, 3, seed=4)]
    grads = []
    for scan in (selective_scan_sequential, selective_scan_parallel, selective_scan_chunked):
        out = scan(*args)
        grads.append(torch.autograd.grad((out * out.detach().sin()).sum(), args))
    for g in grads[1:]:
        for a, b in zip(g, grads[0]):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_combine_is_associative_not_commutative():
    g = torch.Generator().manual_seed(0)
    s = [(torch.rand(7, generator=g), torch.randn(7, generator=g)) for _ in range(3)]
    left, right = combine(combine(s[0], s[1]), s[2]), combine(s[0], combine(s[1], s[2]))
    torch.testing.assert_close(left, right)
    assert not torch.allclose(combine(s[0], s[1])[1], combine(s[1], s[0])[1])


def test_associative_scan_returns_products():
    a, b = torch.rand(2, 13, 3, dtype=torch.float64), torch.randn(2, 13, 3, dtype=torch.float64)
    P, h = associative_scan(a, b)
    torch.testing.assert_close(P, torch.cumprod(a, 1))


def test_zoh_matches_matrix_exponential():
    g = torch.Generator().manual_seed(1)
    A, B = -torch.rand(6, generator=g, dtype=torch.float64) * 3 - 0.1, torch.randn(6, generator=g, dtype=torch.float64)
    A_bar, B_bar = ssm.discretize_zoh(A, B, 0.37)
    M = torch.linalg.matrix_exp(torch.diag(A) * 0.37)
    torch.testing.assert_close(A_bar, torch.diagonal(M))
    torch.testing.assert_close(B_bar, torch.linalg.solve(torch.diag(A) * 0.37, (M - torch.eye(6, dtype=M.dtype)) @ (0.37 * B)))
    # Euler agrees to first order only
    eA, eB = ssm.discretize_euler(A, B, 1e-4)
    zA, zB = ssm.discretize_zoh(A, B, 1e-4)
    assert (eA - zA).abs().max() < 1e-7 and (eB - zB).abs().max() < 1e-7


def test_recurrence_equals_convolution():
    g = torch.Generator().manual_seed(2)
    N, L = 5, 77
    A = -torch.rand(N, generator=g, dtype=torch.float64) - 0.05
    B, C = torch.randn(N, generator=g, dtype=torch.float64), torch.randn(N, generator=g, dtype=torch.float64)
    A_bar, B_bar = ssm.discretize_zoh(A, B, 0.3)
    u = torch.randn(L, generator=g, dtype=torch.float64)
    K = ssm.ssm_kernel(A_bar, B_bar, C, L)
    torch.testing.assert_close(ssm.ssm_convolve(K, u), ssm.ssm_recurrent(A_bar, B_bar, C, u))


@pytest.mark.parametrize("L, chunk", [(37, 8), (37, 36), (5, 16), (64, None), (70, None)])
def test_chunked_pads_with_identity_steps(L, chunk):
    """A last, partial chunk is padded with Δ = 0 (identity steps): outputs, final state and gradients
    equal the loop's, and nothing of the padding leaks out."""
    args = [a.double().requires_grad_() for a in inputs(2, L, 3, 4, seed=L)]
    y_ref, h_ref = selective_scan_sequential(*args, return_state=True)
    y, h = selective_scan_chunked(*args, chunk=chunk, return_state=True)
    assert y.shape == y_ref.shape and h.shape == h_ref.shape
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(h, h_ref)
    g_ref = torch.autograd.grad((y_ref * y_ref.detach().cos()).sum() + h_ref.sum(), args)
    g = torch.autograd.grad((y * y.detach().cos()).sum() + h.sum(), args)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b)


def test_default_chunk_is_about_sqrt_length():
    from course_lib.mamba.scan import default_chunk
    assert [default_chunk(L) for L in (1, 2, 15, 16, 1000, 1024, 4096)] == [1, 1, 3, 4, 31, 32, 64]


def test_sequential_backward_is_linear_in_length():
    """The loop reads positions with unbind: the backward must not build one full-size tensor per step."""
    args = [a.requires_grad_() for a in inputs(1, 512, 8, 4, seed=0)]
    out = selective_scan_sequential(*args)
    grad_fns, stack = set(), [out.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in grad_fns:
            continue
        grad_fns.add(fn)
        stack.extend(f for f, _ in fn.next_functions)
    assert not any(type(fn).__name__ == "SelectBackward0" for fn in grad_fns)

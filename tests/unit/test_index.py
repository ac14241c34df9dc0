"""Index arithmetic: every simplified view index equals plain integer arithmetic."""
import itertools
import math
import random

import pytest
import torch

from aotpack.ir.graph import Index, flat_index, unflatten_index



def _evaluate(index: Index, env: dict) -> int:
    # C's '/' on non-negative ints is Python's '//'
    return eval(index.render().replace("/", "//"), {}, dict(env))


def _reshape_cases(count: int, seed: int = 0):
    rng = random.Random(seed)
    for _ in range(count):
        old = [rng.choice([1, 2, 3, 4, 6, 8]) for _ in range(rng.randint(1, 4))]
        factors, n = [], math.prod(old)
        for f in (2, 3):
            while n % f == 0:
                factors.append(f)
                n //= f
        rng.shuffle(factors)
        new = [1] * rng.randint(1, 4)
        for f in factors:
            new[rng.randrange(len(new))] *= f
        yield old, new


@pytest.mark.parametrize("old,new", list(_reshape_cases(200)))
def test_reshape_index_matches_integer_arithmetic(old, new):
    loop_vars = [Index.var(f"v{d}", size) for d, size in enumerate(new)]
    mapped = unflatten_index(flat_index(loop_vars, new), old)
    new_strides = [math.prod(new[d + 1:]) for d in range(len(new))]
    old_strides = [math.prod(old[d + 1:]) for d in range(len(old))]
    for point in itertools.product(*[range(s) for s in new]):
        flat = sum(p * s for p, s in zip(point, new_strides))
        expected = [(flat // st) % size for st, size in zip(old_strides, old)]
        env = {f"v{d}": p for d, p in enumerate(point)}
        assert [_evaluate(m, env) for m in mapped] == expected


def test_head_split_simplifies_to_plain_division():
    # (16,128,64) viewed as (4,4,128,64): the attention head split in the sample
    index = [Index.var("i0", 16), Index.var("i1", 128), Index.var("j", 64)]
    mapped = unflatten_index(flat_index(index, (16, 128, 64)), (4, 4, 128, 64))
    assert [m.render() for m in mapped] == ["((i0) / 4)", "((i0) % 4)", "i1", "j"]


def test_merge_of_contiguous_dims_stays_affine():
    index = [Index.var("i0", 512), Index.var("j", 256)]
    mapped = unflatten_index(flat_index(index, (512, 256)), (4, 128, 256))
    assert [m.render() for m in mapped] == ["((i0) / 128)", "((i0) % 128)", "j"]


def _chain_cases(count: int, seed: int = 1):
    rng = random.Random(seed)
    for old, mid in _reshape_cases(count, seed):
        factors = [f for size in mid for f in _prime_factors(size)]
        rng.shuffle(factors)
        new = [1] * rng.randint(1, 4)
        for f in factors:
            new[rng.randrange(len(new))] *= f
        yield old, mid, new


def _prime_factors(n: int) -> list[int]:
    found = []
    for f in (2, 3):
        while n % f == 0:
            found.append(f)
            n //= f
    return found


@pytest.mark.parametrize("shapes", list(_chain_cases(100)))
def test_reshape_chains_match_integer_arithmetic(shapes):
    # new -> mid -> old, as views of views produce; exercises split/merge recombination
    old, mid, new = shapes
    loop_vars = [Index.var(f"v{d}", size) for d, size in enumerate(new)]
    in_mid = unflatten_index(flat_index(loop_vars, new), mid)
    in_old = unflatten_index(flat_index(in_mid, mid), old)
    old_strides = [math.prod(old[d + 1:]) for d in range(len(old))]
    new_strides = [math.prod(new[d + 1:]) for d in range(len(new))]
    for point in itertools.product(*[range(s) for s in new]):
        flat = sum(p * s for p, s in zip(point, new_strides))
        env = {f"v{d}": p for d, p in enumerate(point)}
        assert [_evaluate(m, env) for m in in_old] == [(flat // st) % size for st, size in zip(old_strides, old)]


def test_split_then_merge_folds_back_to_the_variable():
    i0 = Index.var("i0", 512)
    parts = unflatten_index(flat_index([i0], (512,)), (4, 128))   # i0 // 128, i0 % 128
    assert flat_index(parts, (4, 128)).render() == "i0"


@pytest.mark.parametrize("shape,dim", [((5,), 0), ((3, 4), 1), ((3, 4), 0), ((2, 3, 4), 1)])
def test_reversed_index_through_reshapes_matches_flip(shape, dim):
    """flip along ``dim``, then reshape to 1-D and back: the index still reads the
    element torch.flip puts there (the reversal is an atom, so reshapes stay exact)."""
    data = torch.arange(math.prod(shape)).reshape(shape)
    expected = data.flip(dim).reshape(-1)
    for flat in range(math.prod(shape)):
        index = unflatten_index(Index.var("f", math.prod(shape)), list(shape))
        index[dim] = index[dim].reversed(shape[dim])
        offset = flat_index(index, shape)
        assert data.reshape(-1)[_evaluate(offset, {"f": flat})] == expected[flat]


def test_shifted_index_of_a_cat_piece_is_exact_where_the_piece_is_read():
    """A cat input read at ``j - 32`` (negative constant) and unflattened into [4, 8]:
    for every j in the piece's range [32, 64) the index equals plain arithmetic."""
    shifted = Index.var("j", 64) + (-32)
    row, col = unflatten_index(shifted, [4, 8])
    for j in range(32, 64):
        assert (_evaluate(row, {"j": j}), _evaluate(col, {"j": j})) == divmod(j - 32, 8)

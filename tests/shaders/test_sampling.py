"""shaders/sampling.metal: two-stage argmax and the top-k / top-p sampler.

The sampler's definition (sampling.metal, above sample_top_kp) is implemented here in
float64 numpy with its own Philox4x32-10, itself checked against the Random123 known
answers. Checks:
- argmax: lowest index wins ties (also all-equal rows), -inf entries, NaN never
  chosen, 248320 entries, several rows written at ids[out_pos + row] and nothing else.
- sampler, exact: every draw equals the float64 reference's draw, or, where the
  uniform (or the top-p target) lies within MARGIN of a CDF boundary so that f32
  summation order may legitimately decide either way, a token on the other side of
  that boundary; such draws must stay rare (at most 1 in 20 and one per test).
- sampler, statistical: over many counters (independent Philox streams), token
  frequencies match the kept, renormalised softmax within 5 binomial standard
  deviations per token (false-alarm rate ~6e-7 per token), and tokens outside
  top-k / top-p are never drawn.
- top_k = 1 and a tiny top_p give the argmax; a fixed seed reproduces its draws.
- logprobs: the chosen token's and the top-n log-softmax of a raw row equal float64
  numpy within 1e-5, the top ids equal a stable descending argsort (ties: lower id),
  also with NaN / -inf entries, vocabularies not a multiple of the threadgroup and the
  27B vocabulary; only the addressed ring slot is written.
"""

import numpy as np
import pytest

from .deltanet_reference import seeded  # the shared stable-seed helper

VOCAB_27B = 248320
SAMPLE_THREADS = 1024  # MQ_SAMPLE_THREADS
SAMPLE_CAP = 2048  # MQ_SAMPLE_CAP
NO_ID = 0xFFFFFFFF  # ids sentinel: never a token id

ARGMAX_PARAMS = np.dtype([(n, "<u4") for n in ("n", "row_stride", "chunk", "n_partials", "out_pos")])
SAMPLE_PARAMS = np.dtype([("n", "<u4"), ("row_stride", "<u4"), ("top_k", "<u4"), ("top_p", "<f4"),
                          ("temperature", "<f4"), ("min_p", "<f4"), ("seed_lo", "<u4"), ("seed_hi", "<u4"), ("counter", "<u4"),
                          ("out_pos", "<u4"), ("drafts", "<u4"), ("draft_pos", "<u4")])
SPEC_ACCEPT_PARAMS = np.dtype([("drafts", "<u4"), ("draft_pos", "<u4")])

# Relative distance (of the total kept mass) from a CDF boundary below which the f32
# kernel and the float64 reference may pick neighbouring tokens: the kernel's f32
# prefix sums (sequential blocks of <= 243 terms, then a tree) err by at most
# ~(243 + 10) * 6e-8 = 1.5e-5 of the total in the worst case, ~1e-6 typically.
MARGIN = 2e-5


@pytest.fixture(scope="module")
def lib(shaders):
    return shaders("sampling.metal")


# ---------------------------------------------------------------------------
# References


def philox4x32_10(ctr, key):
    """Philox4x32-10 (Salmon et al. 2011) -> 4 uint32 words."""
    m0, m1, w0, w1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
    c = [int(v) & 0xFFFFFFFF for v in ctr]
    k = [int(v) & 0xFFFFFFFF for v in key]
    for r in range(10):
        if r:
            k = [(k[0] + w0) & 0xFFFFFFFF, (k[1] + w1) & 0xFFFFFFFF]
        p0, p1 = m0 * c[0], m1 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k[0], p1 & 0xFFFFFFFF, (p0 >> 32) ^ c[3] ^ k[1], p0 & 0xFFFFFFFF]
    return c


def uniform(seed, position):
    """The draw's uniform: Philox key (seed_lo, seed_hi), counter (position, 0, 0, 0)."""
    bits = philox4x32_10((position & 0xFFFFFFFF, 0, 0, 0), (seed & 0xFFFFFFFF, seed >> 32))[0]
    return (bits >> 8) / 2.0**24


def kept_distribution(logits, temperature, top_k, top_p, top_p_group=None, min_p=0.0):
    """(keep mask, w, top-p alternatives) per the sampler's definition, in float64.

    top-p keeps the values >= vals[j], j the first distinct value (descending) whose
    cumulative mass reaches top_p * W. `alternatives` lists every j whose cumulative
    mass lies within MARGIN * W of that target (where f32 sums may decide otherwise);
    top_p_group=j forces that choice."""
    lv = np.asarray(logits, np.float64).copy()
    lv[np.isnan(lv)] = -np.inf
    m = lv.max()
    with np.errstate(invalid="ignore"):
        w = np.exp((lv - m) / temperature)
    w[~np.isfinite(lv)] = 0.0
    finite = np.isfinite(lv)
    keep = finite.copy()
    if 0 < top_k < finite.sum():
        thr = np.sort(lv[finite])[::-1][top_k - 1]
        keep &= lv >= thr
    alternatives = []
    if top_p < 1.0:
        vals = np.unique(lv[keep])[::-1]  # distinct kept values, descending
        order = np.argsort(-lv[keep], kind="stable")
        sorted_vals, sorted_w = lv[keep][order], w[keep][order]
        ends = np.searchsorted(-sorted_vals, -vals, side="right")  # group ends in the sorted list
        mass = np.cumsum(sorted_w)[ends - 1]
        target = np.float32(top_p) * mass[-1]
        j = int(np.argmax(mass >= target))
        alternatives = [i for i in range(len(vals)) if abs(mass[i] - target) <= MARGIN * mass[-1]]
        if j not in alternatives:
            alternatives.append(j)
        if top_p_group is not None:
            j = top_p_group
        keep &= lv >= vals[j]
    keep &= w >= min_p  # min-p last: probability >= min_p times the top one's (w = 1 there)
    return keep, w, alternatives


def draw(keep, w, u):
    """Inverse CDF in index order: (token, tokens whose CDF interval lies within MARGIN
    of the target, i.e. every token f32 summation could legitimately pick)."""
    wk = np.where(keep, w, 0.0)
    cum = np.cumsum(wk)
    total = cum[-1]
    target = u * total
    token = int(np.argmax(cum > target))
    lo = cum - wk
    near = (wk > 0) & (lo <= target + MARGIN * total) & (cum >= target - MARGIN * total)
    return token, set(np.flatnonzero(near).tolist())


def sample_ref(logits, temperature, top_k, top_p, seed, position, min_p=0.0):
    """(token, acceptable tokens): the reference draw and every draw within rounding of it."""
    lv = np.asarray(logits, np.float64).copy()
    lv[np.isnan(lv)] = -np.inf
    if not temperature > 0 or not np.isfinite(lv.max()):
        token = int(np.argmax(lv))
        return token, {token}
    u = uniform(seed, position)
    keep, w, alternatives = kept_distribution(logits, temperature, top_k, top_p, min_p=min_p)
    token, ok = draw(keep, w, u)
    for j in alternatives:  # top-p targets within rounding of a group boundary
        ok |= draw(*kept_distribution(logits, temperature, top_k, top_p, top_p_group=j, min_p=min_p)[:2], u)[1]
    return token, ok


def test_philox_reference_known_answers():
    # Random123 kat_vectors: counter (4 words), key (2 words) -> 4 words.
    assert philox4x32_10((0, 0, 0, 0), (0, 0)) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert philox4x32_10((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2) == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    assert philox4x32_10((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0)) == \
        [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]


def test_reference_top_p_keeps_smallest_top_set_with_ties():
    logits = np.log(np.array([0.1, 0.4, 0.2, 0.2, 0.1]))
    keep, _, _ = kept_distribution(logits, 1.0, 0, 0.5)
    assert keep.tolist() == [False, True, True, True, False]  # 0.4 < 0.5; the tied 0.2s come together
    keep, _, _ = kept_distribution(logits, 1.0, 2, 1.0)
    assert keep.tolist() == [False, True, True, True, False]  # k = 2 with a tie at the 2nd value


# ---------------------------------------------------------------------------
# Runners


def run_argmax(dev, lib, logits, chunk, out_pos=3, threads=256, final_threads=64):
    logits = np.atleast_2d(np.asarray(logits, np.float32))
    rows, n = logits.shape
    n_partials = -(-n // chunk)
    params = np.array([(n, n, chunk, n_partials, out_pos)], ARGMAX_PARAMS)
    partials = dev.empty(rows * n_partials * 8)
    ids = dev.buffer(np.full(out_pos + rows + 2, NO_ID, np.uint32))
    cb = dev.command_buffer()
    cb.dispatch(lib.kernel("argmax_partial"), {0: dev.buffer(logits), 1: partials, 2: params},
                (n_partials, rows), (threads,))
    cb.barrier()
    cb.dispatch(lib.kernel("argmax_final"), {0: partials, 1: ids, 2: params}, (rows,), (final_threads,))
    cb.commit()
    cb.wait()
    got = ids.numpy(np.uint32)
    assert (got[:out_pos] == NO_ID).all() and (got[out_pos + rows:] == NO_ID).all(), "ids written outside the rows"
    return got[out_pos:out_pos + rows]


def run_sampler(dev, lib, logits, *, temperature, top_k=0, top_p=1.0, min_p=0.0, seed=1234, counter=0,
                threads=SAMPLE_THREADS, out_pos=2, drafts=None):
    """The sampler's tokens for each row; ``drafts`` (one id per row) runs it in draft mode."""
    logits = np.atleast_2d(np.asarray(logits, np.float32))
    rows, n = logits.shape
    draft_rows = 0 if drafts is None else len(drafts)
    draft_pos = 5
    draft_ids = np.full(draft_pos + draft_rows + 1, NO_ID, np.uint32)
    if drafts is not None:
        draft_ids[draft_pos:draft_pos + draft_rows] = drafts
    params = np.array([(n, n, top_k, top_p, temperature, min_p, seed & 0xFFFFFFFF, seed >> 32, counter, out_pos,
                        draft_rows, draft_pos)], SAMPLE_PARAMS)
    ids = dev.buffer(np.full(out_pos + rows + 2, NO_ID, np.uint32))
    lib.kernel("sample_top_kp").dispatch({0: dev.buffer(logits), 1: ids, 2: params, 3: dev.buffer(draft_ids)},
                                         threadgroups=(rows,), threads=(threads,))
    got = ids.numpy(np.uint32)
    assert (got[:out_pos] == NO_ID).all() and (got[out_pos + rows:] == NO_ID).all(), "ids written outside the rows"
    return got[out_pos:out_pos + rows].astype(np.int64)


def llm_logits(rng, n, peak=8.0):
    """Logits shaped like a language model's: a broad N(0, 2^2) bulk plus a handful of
    tokens standing out by a few units, all distinct."""
    x = (rng.standard_normal(n) * 2.0).astype(np.float32)
    top = rng.choice(n, size=min(12, n), replace=False)
    x[top] = (x.max() + rng.uniform(0.0, peak, top.size)).astype(np.float32)
    return x


def peaked_logits(rng, n, gap=10.0):
    """A confident model: an N(0, 3^2) bulk and 50 tokens up to `gap` above it, which
    carry nearly all the mass (top-p is then decided among a few tokens)."""
    x = (rng.standard_normal(n) * 3.0).astype(np.float32)
    top = rng.choice(n, size=min(50, n), replace=False)
    x[top] = (x.max() + gap * rng.uniform(0.0, 1.0, top.size)).astype(np.float32)
    return x


def check_against_reference(got, logits_rows, *, temperature, top_k, top_p, seed, counter, what, min_p=0.0):
    """Every draw must be the reference's, or (rarely) a token within rounding of it."""
    ambiguous = 0
    for r, tok in enumerate(got):
        want, ok = sample_ref(logits_rows[r], temperature, top_k, top_p, seed, counter + r, min_p)
        if tok != want:
            assert tok in ok, f"{what}: row {r} drew {tok}, reference {want} (acceptable: {sorted(ok)[:8]})"
            ambiguous += 1
    assert ambiguous <= max(1, len(got) // 20), f"{what}: {ambiguous} of {len(got)} draws differ within rounding"


# ---------------------------------------------------------------------------
# argmax


@pytest.mark.parametrize("n,chunk", [(1, 8), (7, 8), (33, 32), (1000, 256), (1000, 7)])
def test_argmax_random_rows_with_ties(dev, lib, n, chunk):
    rng = seeded("argmax", n, chunk)
    rows = 4
    x = rng.standard_normal((rows, n)).astype(np.float32)
    if n > 2:
        best = x[1].max() + 1.0
        spots = rng.choice(n, size=3, replace=False)
        x[1, spots] = best  # a three-way tie: the lowest index must win
        x[2, :] = 0.5  # all equal
        x[3, rng.choice(n, size=n // 2, replace=False)] = -np.inf
    got = run_argmax(dev, lib, x, chunk)
    np.testing.assert_array_equal(got, np.argmax(x, axis=1))  # numpy: first occurrence


def test_argmax_special_values(dev, lib):
    n = 300
    rows = np.zeros((5, n), np.float32)
    rows[0] = -np.inf  # all -inf: index 0
    rows[1] = -np.inf
    rows[1, 250] = -3.0
    rows[2] = np.nan  # NaN is never chosen...
    rows[2, 123] = -np.inf  # ...the only non-NaN entry wins
    rows[3] = np.nan  # all NaN: id 0
    rows[4, :] = -1.0
    rows[4, [10, 290]] = np.inf
    got = run_argmax(dev, lib, rows, chunk=64)
    assert got.tolist() == [0, 250, 123, 0, 10]


def test_argmax_27b_vocab(dev, lib):
    rng = seeded("argmax-27b")
    x = llm_logits(rng, VOCAB_27B)
    x[VOCAB_27B - 1] = x.max() + 0.5  # the winner in the very last chunk...
    y = x.copy()
    y[[77, 200000]] = y.max() + 1.0  # ...and a tie across distant chunks
    got = run_argmax(dev, lib, np.stack([x, y]), chunk=1024, threads=256)
    assert got.tolist() == [VOCAB_27B - 1, 77]


# ---------------------------------------------------------------------------
# sampler: equivalences with argmax, reproducibility


def test_sampler_top_k_1_and_tiny_top_p_are_argmax(dev, lib):
    rng = seeded("greedy-equiv")
    x = np.stack([llm_logits(rng, 3000) for _ in range(6)])
    want = np.argmax(x, axis=1)
    for kwargs in (dict(top_k=1), dict(top_p=1e-6), dict(top_k=50, top_p=1e-6)):
        for seed in (1, 2, 99):
            got = run_sampler(dev, lib, x, temperature=1.5, seed=seed, threads=128, **kwargs)
            np.testing.assert_array_equal(got, want, err_msg=f"{kwargs} seed {seed}")
    np.testing.assert_array_equal(run_sampler(dev, lib, x, temperature=0.0, threads=64), want, err_msg="T = 0")


def test_sampler_reproducible_for_a_seed(dev, lib):
    rng = seeded("repro")
    x = np.stack([llm_logits(rng, 500, peak=1.0) for _ in range(16)])
    first = run_sampler(dev, lib, x, temperature=1.0, top_k=40, top_p=0.9, seed=7, counter=100, threads=64)
    again = run_sampler(dev, lib, x, temperature=1.0, top_k=40, top_p=0.9, seed=7, counter=100, threads=64)
    np.testing.assert_array_equal(first, again)
    other = run_sampler(dev, lib, x, temperature=1.0, top_k=40, top_p=0.9, seed=8, counter=100, threads=64)
    assert (other != first).any(), "another seed should change some draws"
    # Row r draws with counter + r: the same position gives the same draw as a lone row.
    lone = run_sampler(dev, lib, x[5:6], temperature=1.0, top_k=40, top_p=0.9, seed=7, counter=105, threads=64)
    assert lone[0] == first[5]


# ---------------------------------------------------------------------------
# sampler: exact agreement with the float64 reference, on every path


SMALL_CASES = [  # (temperature, top_k, top_p, threads)
    (1.0, 0, 1.0, 32),  # plain softmax
    (0.7, 5, 1.0, 32),  # top-k resolved from the per-thread maxima
    (1.3, 0, 0.8, 32),  # top-p alone
    (0.9, 10, 0.9, 64),  # both, top-p inside the gathered top-k set
    (1.0, 45, 1.0, 32),  # k > threads: bracket from the whole range
]


@pytest.mark.parametrize("temperature,top_k,top_p,threads", SMALL_CASES)
def test_sampler_matches_reference_small_vocab(dev, lib, temperature, top_k, top_p, threads):
    rng = seeded("small", temperature, top_k, top_p)
    rows, n = 96, 50
    x = np.stack([llm_logits(rng, n, peak=2.0) for _ in range(rows)])
    got = run_sampler(dev, lib, x, temperature=temperature, top_k=top_k, top_p=top_p, seed=42, counter=9,
                      threads=threads)
    check_against_reference(got, x, temperature=temperature, top_k=top_k, top_p=top_p, seed=42, counter=9,
                            what=f"T={temperature} k={top_k} p={top_p}")


LARGE_CASES = [  # (n, temperature, top_k, top_p, threads): the bisection paths, brackets > CAP
    (5000, 1.0, 3000, 1.0, 64),  # count bisection until <= CAP remain in the bracket
    (5000, 1.0, 0, 0.95, 64),  # mass bisection
    (5000, 0.8, 3000, 0.5, 64),  # top-p after a top-k that was not fully gathered
    (5000, 1.0, 100, 1.0, 64),  # k > threads
]


@pytest.mark.parametrize("n,temperature,top_k,top_p,threads", LARGE_CASES)
def test_sampler_matches_reference_bisection_paths(dev, lib, n, temperature, top_k, top_p, threads):
    rng = seeded("large", n, temperature, top_k, top_p)
    rows = 6
    x = np.stack([(rng.standard_normal(n) * 1.5).astype(np.float32) for _ in range(rows)])
    got = run_sampler(dev, lib, x, temperature=temperature, top_k=top_k, top_p=top_p, seed=5, counter=0,
                      threads=threads)
    check_against_reference(got, x, temperature=temperature, top_k=top_k, top_p=top_p, seed=5, counter=0,
                            what=f"n={n} k={top_k} p={top_p}")


def tied_logits(rng, n, ties):
    """50 distinct tokens on top (~12 % of the mass at T = 1), `ties` tokens sharing one
    value (~70 %), the rest distinct below, shuffled: a top-k or top-p threshold inside the
    tie keeps all of it, so the bisection ends with more tied entries than it can gather."""
    x = np.concatenate([2.0 + rng.uniform(0.0, 0.5, 50), np.zeros(ties), -rng.uniform(0.5, 3.0, n - 50 - ties)])
    return rng.permutation(x).astype(np.float32)


TIE_CASES = [  # (top_k, top_p, threads): thresholds that fall inside > CAP tied logits
    (1000, 1.0, 256),  # count bisection (k > threads)
    (1000, 1.0, SAMPLE_THREADS),  # count bisection from the per-thread maxima bound
    (0, 0.5, 256),  # mass bisection
    (1000, 0.5, 128),  # top-p inside a top-k set too large to gather
]


@pytest.mark.parametrize("top_k,top_p,threads", TIE_CASES)
def test_sampler_threshold_inside_more_tied_logits_than_it_can_gather(dev, lib, top_k, top_p, threads):
    rng = seeded("ties", top_k, top_p, threads)
    ties = SAMPLE_CAP + 952
    x = np.stack([tied_logits(rng, 6000, ties) for _ in range(8)])
    keep = kept_distribution(x[0], 1.0, top_k, top_p)[0]
    assert keep.sum() == 50 + ties, "the threshold must fall inside the tie"
    got = run_sampler(dev, lib, x, temperature=1.0, top_k=top_k, top_p=top_p, seed=31, counter=4, threads=threads)
    check_against_reference(got, x, temperature=1.0, top_k=top_k, top_p=top_p, seed=31, counter=4,
                            what=f"{ties} ties k={top_k} p={top_p}")
    assert (x[np.arange(len(got)), got] == 0.0).sum() >= len(got) // 2, "most draws should land in the tie"


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 20, 0.95), pytest.param(1.0, 0, 0.9, marks=pytest.mark.slow),
                                                     (1.0, 0, 1.0), (0.6, 2000, 1.0)])
def test_sampler_27b_vocab(dev, lib, temperature, top_k, top_p):
    rng = seeded("27b", temperature, top_k, top_p)
    x = np.stack([llm_logits(rng, VOCAB_27B, peak=3.0), (rng.standard_normal(VOCAB_27B) * 3).astype(np.float32),
                  peaked_logits(rng, VOCAB_27B)])
    got = run_sampler(dev, lib, x, temperature=temperature, top_k=top_k, top_p=top_p, seed=2024, counter=77)
    check_against_reference(got, x, temperature=temperature, top_k=top_k, top_p=top_p, seed=2024, counter=77,
                            what=f"27B T={temperature} k={top_k} p={top_p}")


# ---------------------------------------------------------------------------
# sampler: statistics over many draws


FREQ_CASES = [  # (temperature, top_k, top_p)
    (1.0, 0, 1.0),
    (1.0, 4, 1.0),
    (1.0, 0, 0.7),
    (0.5, 6, 0.9),
]


@pytest.mark.parametrize("temperature,top_k,top_p", FREQ_CASES)
def test_sampler_frequencies_match_softmax(dev, lib, temperature, top_k, top_p):
    n, draws = 12, 10000
    logits = np.log(np.array([0.2, 0.15, 0.12, 0.1, 0.09, 0.08, 0.07, 0.06, 0.05, 0.04, 0.03, 0.01]))
    logits = logits[np.random.default_rng(3).permutation(n)].astype(np.float32)
    x = np.tile(logits, (draws, 1))
    got = run_sampler(dev, lib, x, temperature=temperature, top_k=top_k, top_p=top_p, seed=99, counter=0, threads=32)
    keep, w, _ = kept_distribution(logits, temperature, top_k, top_p)
    p = np.where(keep, w, 0.0) / np.where(keep, w, 0.0).sum()
    counts = np.bincount(got, minlength=n)
    assert counts.sum() == draws and len(counts) == n
    assert counts[~keep].sum() == 0, f"tokens outside the kept set drawn: {counts[~keep]}"
    sigma = np.sqrt(draws * p * (1 - p))
    dev_sigma = np.abs(counts - draws * p) / np.maximum(sigma, 1e-12)
    assert (dev_sigma[keep] <= 5.0).all(), f"frequencies off: counts {counts}, expected {np.round(draws * p, 1)}"


# ---------------------------------------------------------------------------
# Speculative verification: draft mode and spec_accept


def kept_probabilities(logits, temperature, top_k, top_p, min_p=0.0):
    keep, w, _ = kept_distribution(logits, temperature, top_k, top_p, min_p=min_p)
    p = np.where(keep, w, 0.0)
    return p / p.sum()


# (draft, temperature, top_k, top_p, min_p): a likely draft, an unlikely one, one outside the
# kept set (never accepted), and the only kept token (always accepted).
DRAFT_CASES = [
    (0, 1.0, 0, 1.0, 0.0),
    (11, 0.8, 0, 0.9, 0.0),
    (9, 1.0, 6, 1.0, 0.0),
    (0, 1.0, 1, 1.0, 0.0),
    (3, 1.3, 0, 1.0, 0.2),
]


@pytest.mark.parametrize("draft,temperature,top_k,top_p,min_p", DRAFT_CASES)
def test_draft_mode_output_has_the_plain_distribution(dev, lib, draft, temperature, top_k, top_p, min_p):
    """Accepting d with probability p(d), else drawing from p without d, must give p itself:
    a chi-square goodness-of-fit over 20000 independent rows (Philox counters)."""
    n, draws = 12, 20000
    logits = np.log(np.array([0.2, 0.15, 0.12, 0.1, 0.09, 0.08, 0.07, 0.06, 0.05, 0.04, 0.03, 0.01]))
    logits = logits.astype(np.float32)
    x = np.tile(logits, (draws, 1))
    got = run_sampler(dev, lib, x, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=7, counter=0,
                      threads=32, drafts=np.full(draws, draft, np.uint32))
    p = kept_probabilities(logits, temperature, top_k, top_p, min_p)
    counts = np.bincount(got, minlength=n)
    assert counts.sum() == draws and len(counts) == n
    assert counts[p == 0].sum() == 0, f"tokens outside the kept set drawn: {counts}"
    kept = p > 0
    chi2 = float((((counts - draws * p) ** 2)[kept] / (draws * p[kept])).sum())
    dof = int(kept.sum()) - 1
    # The 1e-4 upper quantile of chi-square is below dof + 4.3 * sqrt(2 dof) + 12 for dof <= 11.
    assert chi2 < dof + 4.3 * np.sqrt(2 * max(dof, 1)) + 12, f"chi2 {chi2:.1f} with {dof} dof: counts {counts}"


def test_draft_mode_accepts_as_often_as_the_draft_is_likely(dev, lib):
    """Writing the draft happens with probability p(d) (when d is drawn, it was accepted);
    rows past `drafts` sample plainly and equal the plain sampler's draws."""
    n, draws = 12, 20000
    logits = np.log(np.linspace(1.0, 2.0, n)).astype(np.float32)
    p = kept_probabilities(logits, 1.0, 0, 1.0)
    got = run_sampler(dev, lib, np.tile(logits, (draws, 1)), temperature=1.0, seed=3, threads=32,
                      drafts=np.full(draws, 4, np.uint32))
    rate = float((got == 4).mean())
    assert abs(rate - p[4]) < 5 * np.sqrt(p[4] * (1 - p[4]) / draws), (rate, p[4])
    rows = np.tile(logits, (6, 1))
    plain = run_sampler(dev, lib, rows, temperature=1.0, seed=3, threads=32)
    mixed = run_sampler(dev, lib, rows, temperature=1.0, seed=3, threads=32, drafts=np.array([1, 2, 3], np.uint32))
    np.testing.assert_array_equal(mixed[3:], plain[3:])


def run_spec_accept(dev, lib, drafts, chosen, draft_pos=4):
    ids = np.full(draft_pos + len(drafts) + 3, NO_ID, np.uint32)
    ids[draft_pos:draft_pos + len(drafts)] = drafts
    ids_buf, accepted = dev.buffer(ids), dev.buffer(np.full(2, NO_ID, np.uint32))
    params = np.array([(len(drafts), draft_pos)], SPEC_ACCEPT_PARAMS)
    lib.kernel("spec_accept").dispatch({0: ids_buf, 1: dev.buffer(np.asarray(chosen, np.uint32)), 2: accepted,
                                        3: params}, threadgroups=(1,), threads=(1,))
    got_ids, got_accepted = ids_buf.numpy(np.uint32), accepted.numpy(np.uint32)
    assert got_accepted[1] == NO_ID, "spec_accept wrote past accepted[0]"
    return int(got_accepted[0]), got_ids


@pytest.mark.parametrize("drafts,chosen,accepted", [
    ([5, 6, 7], [5, 6, 7, 8], 3),  # all accepted: the bonus token follows
    ([5, 6, 7], [5, 9, 7, 8], 1),  # rejected at depth 2: the correction replaces draft 2
    ([5, 6, 7], [1, 6, 7, 8], 0),  # rejected at once
    ([], [42], 0),                 # no drafts: a plain step
])
def test_spec_accept_counts_the_leading_matches(dev, lib, drafts, chosen, accepted):
    got, ids = run_spec_accept(dev, lib, drafts, chosen)
    assert got == accepted
    want = np.full(len(ids), NO_ID, np.uint32)
    want[4:4 + len(drafts)] = drafts
    want[4 + accepted] = chosen[accepted]  # the next token, where the next step reads it
    np.testing.assert_array_equal(ids, want)


def test_sampler_never_draws_minus_inf_or_nan(dev, lib):
    rng = seeded("inf")
    rows, n = 64, 40
    x = np.zeros((rows, n), np.float32)  # flat: every finite token is likely
    bad = rng.choice(n, size=10, replace=False)
    x[:, bad[:6]] = -np.inf
    x[:, bad[6:]] = np.nan
    got = run_sampler(dev, lib, x, temperature=1.0, seed=11, threads=32)
    assert not np.isin(got, bad).any()
    assert len(np.unique(got)) > 10  # and it does spread over the rest
    check_against_reference(got, x, temperature=1.0, top_k=0, top_p=1.0, seed=11, counter=0, what="-inf/NaN")


def test_sampler_keeps_ties_at_the_top_k_threshold(dev, lib):
    draws = 2000
    logits = np.array([3.0, 1.0, 2.0, 2.0, 0.0, 2.0, -1.0, 0.5, 1.5, -2.0], np.float32)  # 2nd value tied 3 ways
    got = run_sampler(dev, lib, np.tile(logits, (draws, 1)), temperature=1.0, top_k=2, seed=5, threads=32)
    assert set(np.unique(got).tolist()) == {0, 2, 3, 5}


# ---------------------------------------------------------------------------
# min-p (applied last, after top-k and top-p)

MIN_P_CASES = [  # (temperature, top_k, top_p, min_p)
    (1.0, 0, 1.0, 0.05),  # min-p alone
    (0.7, 10, 1.0, 0.1),  # inside a top-k set
    (1.3, 0, 0.9, 0.02),  # inside a top-p set
    (1.0, 0, 1.0, 0.0),  # 0 = off: the plain sampler
]


@pytest.mark.parametrize("temperature,top_k,top_p,min_p", MIN_P_CASES)
def test_sampler_min_p_matches_reference(dev, lib, temperature, top_k, top_p, min_p):
    rng = seeded("min-p", temperature, top_k, top_p, min_p)
    rows, n = 96, 300
    x = np.stack([llm_logits(rng, n, peak=3.0) for _ in range(rows)])
    # No weight within f32 rounding of min_p (those are moved off it), so the kept set is
    # the same in f32 and f64.
    while min_p > 0:
        w = np.exp((x.astype(np.float64) - x.max(axis=1, keepdims=True)) / temperature)
        near = np.abs(w / min_p - 1) <= 1e-5
        if not near.any():
            break
        x[near] -= np.float32(0.01)
    got = run_sampler(dev, lib, x, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=3,
                      counter=11, threads=64)
    check_against_reference(got, x, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=3,
                            counter=11, what=f"T={temperature} k={top_k} p={top_p} min_p={min_p}")
    if min_p > 0:
        keep = np.stack([kept_distribution(x[r], temperature, top_k, top_p, min_p=min_p)[0] for r in range(rows)])
        assert keep.sum(axis=1).min() >= 1 and (keep.sum(axis=1) < n).all()  # min-p did cut something
        assert keep[np.arange(rows), got].all()


def test_sampler_min_p_1_is_argmax(dev, lib):
    rng = seeded("min-p-greedy")
    x = np.stack([llm_logits(rng, 3000) for _ in range(6)])
    for seed in (1, 2, 99):
        got = run_sampler(dev, lib, x, temperature=1.5, min_p=1.0, seed=seed, threads=128)
        np.testing.assert_array_equal(got, np.argmax(x, axis=1), err_msg=f"seed {seed}")


# ---------------------------------------------------------------------------
# penalties: penalty_count then penalty_apply, as the engine dispatches them

PENALTY_PARAMS = np.dtype([("n", "<u4"), ("start", "<u4"), ("generated_from", "<u4"), ("end", "<u4"),
                           ("repetition", "<f4"), ("presence", "<f4"), ("frequency", "<f4")])


def penalties_ref(logits, ids, *, start, generated_from, end, repetition, presence, frequency):
    """vLLM's order in float32: repetition over ids[start, end), then frequency and presence
    over the generated ids[generated_from, end)."""
    n = logits.size
    seen = np.bincount(ids[start:end], minlength=n)[:n]
    generated = np.bincount(ids[max(start, generated_from):end], minlength=n)[:n]
    out = logits.astype(np.float32).copy()
    r = np.float32(repetition)
    hit = seen > 0
    out[hit] = np.where(out[hit] > 0, out[hit] / r, out[hit] * r)
    out -= np.float32(frequency) * generated.astype(np.float32)
    out -= np.where(generated > 0, np.float32(presence), np.float32(0))
    return out


def run_penalties(dev, lib, logits, ids, counts=None, **kw):
    logits = np.asarray(logits, np.float32)
    n = logits.size
    params = np.array([(n, kw["start"], kw["generated_from"], kw["end"], kw["repetition"], kw["presence"],
                        kw["frequency"])], PENALTY_PARAMS)
    counts = counts if counts is not None else dev.buffer(np.zeros(2 * n, np.uint32))
    out = dev.buffer(np.full(n + 3, np.nan, np.float32))  # NaN: entries never written
    cb = dev.command_buffer()
    positions = kw["end"] - kw["start"]
    if positions > 0:
        cb.dispatch(lib.kernel("penalty_count"), {0: dev.buffer(np.asarray(ids, np.uint32)), 1: counts, 2: params},
                    (-(-positions // 64),), (64,))
        cb.barrier()
    cb.dispatch(lib.kernel("penalty_apply"), {0: dev.buffer(logits), 1: counts, 2: out, 3: params},
                (-(-n // 96),), (96,))
    cb.commit()
    cb.wait()
    got = out.numpy(np.float32)
    assert np.isnan(got[n:]).all(), "written past the row"
    assert (counts.numpy(np.uint32) == 0).all(), "counts not back to zero"
    return got[:n], counts


PENALTY_CASES = [  # (repetition, presence, frequency, start = 0 unless repetition is off)
    (1.3, 0.0, 0.0),
    (1.0, 0.7, 0.0),
    (1.0, 0.0, 0.4),
    (0.8, -0.5, 1.5),  # below-1 repetition and a negative presence reward repeats
    (1.0, 0.0, 0.0),  # neutral: the row unchanged
]


@pytest.mark.parametrize("repetition,presence,frequency", PENALTY_CASES)
@pytest.mark.parametrize("n", [1, 31, 1000])
def test_penalties_match_reference(dev, lib, n, repetition, presence, frequency):
    rng = seeded("penalties", n, repetition, presence, frequency)
    logits = (rng.standard_normal(n) * 3).astype(np.float32)
    logits[rng.choice(n, size=min(n, 3), replace=False)] = 0.0  # zero: the multiply branch
    ids = rng.integers(0, min(n, 40), size=300).astype(np.uint32)  # many repeats
    generated_from, end = 200, 290  # ids after end are not counted
    start = 0 if repetition != 1.0 else generated_from
    kw = dict(start=start, generated_from=generated_from, end=end, repetition=repetition, presence=presence,
              frequency=frequency)
    got, counts = run_penalties(dev, lib, logits, ids, **kw)
    np.testing.assert_array_equal(got, penalties_ref(logits, ids, **kw))
    if (repetition, presence, frequency) == (1.0, 0.0, 0.0):
        np.testing.assert_array_equal(got, logits)
    # The counts buffer is left zeroed: a second step on it gives the same row.
    again, _ = run_penalties(dev, lib, logits, ids, counts=counts, **kw)
    np.testing.assert_array_equal(again, got)


def test_penalties_empty_history_and_ids_outside_the_vocabulary(dev, lib):
    logits = np.linspace(-2, 2, 50).astype(np.float32)
    ids = np.array([3, 3, 900, 0xFFFFFFFF, 7], np.uint32)  # out-of-vocabulary ids are skipped
    kw = dict(start=0, generated_from=2, end=5, repetition=2.0, presence=1.0, frequency=0.5)
    got, _ = run_penalties(dev, lib, logits, ids, **kw)
    want = logits.copy()
    want[3] = want[3] * np.float32(2.0)  # negative: times r; seen only in the prompt
    want[7] = want[7] * np.float32(2.0) - np.float32(0.5) - np.float32(1.0)  # and generated once
    np.testing.assert_array_equal(got, want)
    none, _ = run_penalties(dev, lib, logits, ids, **dict(kw, start=5, generated_from=5))
    np.testing.assert_array_equal(none, logits)  # nothing counted (the engine skips penalty_count then)


# ---------------------------------------------------------------------------
# logprobs: token_logprobs over a raw row, after the choice wrote ids[out_pos]

LOGPROB_PARAMS = np.dtype([(n, "<u4") for n in ("n", "top_n", "out_pos", "slot")])
LOGPROB_MAX_TOP = 20  # MQ_LOGPROB_MAX_TOP
LOGPROB_ENTRY_WORDS = 4 + 2 * LOGPROB_MAX_TOP  # MQ_LOGPROB_ENTRY_WORDS
LOGPROB_SLOTS = 4  # MQ_LOGPROB_SLOTS


def logprobs_ref(logits):
    """float64 log-softmax with NaN counted as -inf."""
    lv = np.asarray(logits, np.float64).copy()
    lv[np.isnan(lv)] = -np.inf
    m = lv[np.isfinite(lv)].max()
    return lv - (m + np.log(np.exp(lv - m).sum()))


def top_ref(logits, top_n):
    """The top_n ids, descending, ties lower id first (a stable sort of the negated row)."""
    lv = np.asarray(logits, np.float64).copy()
    lv[np.isnan(lv)] = -np.inf
    return np.argsort(-lv, kind="stable")[:top_n]


def run_logprobs(dev, lib, logits, chosen, top_n, threads=256, slot=2, out_pos=5):
    logits = np.asarray(logits, np.float32)
    n = logits.size
    ids = np.full(out_pos + 2, NO_ID, np.uint32)
    ids[out_pos] = chosen
    out = dev.buffer(np.full(LOGPROB_SLOTS * LOGPROB_ENTRY_WORDS, NO_ID, np.uint32))
    params = np.array([(n, top_n, out_pos, slot)], LOGPROB_PARAMS)
    lib.kernel("token_logprobs").dispatch({0: dev.buffer(logits), 1: dev.buffer(ids), 2: out, 3: params},
                                          threadgroups=(1,), threads=(threads,))
    words = out.numpy(np.uint32).reshape(LOGPROB_SLOTS, LOGPROB_ENTRY_WORDS)
    others = np.delete(words, slot, axis=0)
    assert (others == NO_ID).all(), "another ring slot was written"
    entry = words[slot]
    assert (entry[4 + top_n:4 + LOGPROB_MAX_TOP] == NO_ID).all(), "top ids written past top_n"
    assert (entry[4 + LOGPROB_MAX_TOP + top_n:] == NO_ID).all(), "top logprobs written past top_n"
    f = entry.view(np.float32)
    return dict(chosen=int(entry[0]), logprob=float(f[1]), lse=float(f[2]), top_n=int(entry[3]),
                top_ids=entry[4:4 + top_n].astype(np.int64),
                top_logprobs=f[4 + LOGPROB_MAX_TOP:4 + LOGPROB_MAX_TOP + top_n].astype(np.float64))


def check_logprobs(got, logits, chosen, top_n):
    want = logprobs_ref(logits)
    assert got["chosen"] == chosen and got["top_n"] == top_n
    np.testing.assert_allclose(got["logprob"], want[chosen], rtol=0, atol=1e-5)
    np.testing.assert_array_equal(got["top_ids"], top_ref(logits, top_n))
    np.testing.assert_allclose(got["top_logprobs"], want[got["top_ids"]], rtol=0, atol=1e-5)


@pytest.mark.parametrize("threads", [32, 96, 256])
@pytest.mark.parametrize("n,top_n", [(1, 0), (1, 1), (7, 5), (31, 20), (33, 20), (257, 3), (1000, 20), (1000, 0)])
def test_logprobs_match_numpy(dev, lib, n, top_n, threads):
    rng = seeded("logprobs", n, top_n, threads)
    logits = llm_logits(rng, n)
    chosen = int(rng.integers(0, n))
    check_logprobs(run_logprobs(dev, lib, logits, chosen, top_n, threads=threads), logits, chosen, top_n)


def test_logprobs_ties_keep_the_lower_id_first(dev, lib):
    rng = seeded("logprobs-ties")
    n = 999
    logits = np.round(rng.standard_normal(n) * 2).astype(np.float32)  # ~10 distinct values: many ties
    logits[[900, 5, 400, 17]] = logits.max() + 1.0  # a four-way tie at the top, spread over threads
    got = run_logprobs(dev, lib, logits, 400, 20, threads=64)
    assert got["top_ids"][:4].tolist() == [5, 17, 400, 900]
    check_logprobs(got, logits, 400, 20)
    flat = np.full(100, 0.25, np.float32)  # all equal: ids 0..19, each log(1/100)
    got = run_logprobs(dev, lib, flat, 99, 20, threads=64)
    assert got["top_ids"].tolist() == list(range(20))
    np.testing.assert_allclose(got["top_logprobs"], np.log(0.01), atol=1e-5)
    np.testing.assert_allclose(got["logprob"], np.log(0.01), atol=1e-5)


def test_logprobs_with_nan_and_minus_inf(dev, lib):
    rng = seeded("logprobs-special")
    n = 300
    logits = llm_logits(rng, n)
    logits[rng.choice(n, size=100, replace=False)] = -np.inf  # masked tokens
    logits[rng.choice(n, size=20, replace=False)] = np.nan  # counted as -inf
    finite = np.flatnonzero(np.isfinite(logits))
    chosen = int(finite[0])
    check_logprobs(run_logprobs(dev, lib, logits, chosen, 20, threads=64), logits, chosen, 20)
    few = np.full(50, -np.inf, np.float32)  # fewer finite entries than top_n: the rest are -inf
    few[[3, 40]] = [1.0, 2.0]
    few[7] = np.nan
    got = run_logprobs(dev, lib, few, 7, 5, threads=32)
    assert got["top_ids"].tolist() == [40, 3, 0, 1, 2]
    np.testing.assert_allclose(got["top_logprobs"][:2], logprobs_ref(few)[[40, 3]], atol=1e-6)
    assert np.isneginf(got["top_logprobs"][2:]).all() and np.isneginf(got["logprob"])


def test_logprobs_27b_vocab(dev, lib):
    rng = seeded("logprobs-27b")
    logits = llm_logits(rng, VOCAB_27B)
    logits[VOCAB_27B - 1] = logits.max() + 0.5  # the best in the very last entry
    chosen = int(np.argmax(logits))
    check_logprobs(run_logprobs(dev, lib, logits, chosen, 20), logits, chosen, 20)


# ---------------------------------------------------------------------------
# token_mask and logit_bias: in place on the rows the choice reads

TOKEN_MASK_PARAMS = np.dtype([(n, "<u4") for n in ("n", "row_stride", "mask_words", "mask_stride")])
LOGIT_BIAS_PARAMS = np.dtype([("n", "<u4"), ("row_stride", "<u4")])
LOGIT_BIAS_MAX = 300  # MQ_LOGIT_BIAS_MAX
TOKEN_MASK_THREADS = 256  # MQ_TOKEN_MASK_THREADS


def test_params_constants_match_the_header():
    from .params import header_constants

    c = header_constants("sampling")
    assert (c["MQ_LOGIT_BIAS_MAX"], c["MQ_TOKEN_MASK_THREADS"]) == (LOGIT_BIAS_MAX, TOKEN_MASK_THREADS)


def pack_mask(allowed, words):
    """bool [rows][n] -> uint32 [rows][words]: bit t % 32 of word t // 32 (llguidance's layout)."""
    rows, n = allowed.shape
    bits = np.zeros((rows, words * 32), bool)
    bits[:, :min(n, words * 32)] = allowed[:, :words * 32]
    return np.packbits(bits, axis=1, bitorder="little").view("<u4")


def run_token_mask(dev, lib, logits, masks, mask_words, *, pad=3, mask_pad=2, threads=TOKEN_MASK_THREADS):
    """token_mask over rows of `logits` laid out with `pad` extra floats per row (NaN: never
    written) and mask rows of mask_words + mask_pad words; returns the rows' first n entries."""
    rows, n = logits.shape
    stride = n + pad
    buf = np.full((rows, stride), np.nan, np.float32)
    buf[:, :n] = logits
    mstride = mask_words + mask_pad
    mbuf = np.full((rows, mstride), 0xFFFFFFFF, np.uint32)  # words past mask_words: never read
    mbuf[:, :masks.shape[1]] = masks
    params = np.array([(n, stride, mask_words, mstride)], TOKEN_MASK_PARAMS)
    out = dev.buffer(buf)
    # Whole threadgroups, so threads past n exist (as they may with dispatchThreadgroups).
    lib.kernel("token_mask").dispatch({0: out, 1: dev.buffer(mbuf), 2: params}, (-(-n // threads), rows), (threads,))
    got = out.numpy(np.float32).reshape(rows, stride)
    assert np.isnan(got[:, n:]).all(), "written past a row's n entries"
    return got[:, :n]


@pytest.mark.parametrize("n,threads", [(1, 32), (33, 64), (1000, 256), (4099, 96)])
def test_token_mask_refuses_the_cleared_bits(dev, lib, n, threads):
    rng = seeded("token_mask", n)
    rows = 3
    logits = rng.standard_normal((rows, n)).astype(np.float32)
    logits[0, ::7] = np.inf  # refused or not, every value is overwritten the same way
    allowed = rng.random((rows, n)) < [[0.5], [0.02], [1.0]]
    words = -(-n // 32)
    got = run_token_mask(dev, lib, logits, pack_mask(allowed, words), words, threads=threads)
    np.testing.assert_array_equal(got, np.where(allowed, logits, -np.inf))


def test_token_mask_refuses_tokens_past_the_grammars_vocabulary(dev, lib):
    # The grammar's vocabulary (the tokenizer's) may be shorter than the logits' rows.
    n, grammar_n = 1000, 700
    rng = seeded("token_mask_short")
    logits = rng.standard_normal((2, n)).astype(np.float32)
    allowed = np.ones((2, grammar_n), bool)
    words = -(-grammar_n // 32)
    got = run_token_mask(dev, lib, logits, pack_mask(allowed, words), words, mask_pad=10)
    want = logits.copy()
    want[:, grammar_n:] = -np.inf  # 700..703: cleared bits of the last word; 704..: past mask_words
    np.testing.assert_array_equal(got, want)


def test_token_mask_then_argmax_and_sampler_choose_allowed_tokens(dev, lib):
    # Verify rows of one sequence: a mask per row; the choice then never leaves it.
    rng = seeded("token_mask_choice")
    rows, n = 4, VOCAB_27B
    logits = np.stack([llm_logits(rng, n) for _ in range(rows)])
    allowed = np.zeros((rows, n), bool)
    for r in range(rows):
        allowed[r, rng.choice(n, size=[1, 5, 300, 20000][r], replace=False)] = True
    words = -(-n // 32)
    masked = run_token_mask(dev, lib, logits, pack_mask(allowed, words), words, pad=0, mask_pad=0)
    np.testing.assert_array_equal(masked, np.where(allowed, logits, -np.inf))
    best = run_argmax(dev, lib, masked, chunk=4096)
    np.testing.assert_array_equal(best, np.argmax(np.where(allowed, logits, -np.inf), axis=1))
    for counter in range(3):
        got = run_sampler(dev, lib, masked, temperature=1.5, top_p=0.95, counter=counter)
        assert all(allowed[r, t] for r, t in enumerate(got)), got


def run_logit_bias(dev, lib, logits, entries, *, pad=3):
    rows, n = logits.shape
    stride = n + pad
    buf = np.full((rows, stride), np.nan, np.float32)
    buf[:, :n] = logits
    params = np.array([(n, stride)], LOGIT_BIAS_PARAMS)
    out = dev.buffer(buf)
    lib.kernel("logit_bias").dispatch({0: out, 1: dev.buffer(entries), 2: params}, (-(-LOGIT_BIAS_MAX // 64), rows),
                                      (64,))  # 320 threads a row: 20 past the table
    got = out.numpy(np.float32).reshape(rows, stride)
    assert np.isnan(got[:, n:]).all(), "written past a row's n entries"
    return got[:, :n]


def bias_table(ids, bias, n_unused):
    """uint2 [LOGIT_BIAS_MAX]: (token, bias bits); unused entries hold an id >= n (and a bias
    of 1, which must not be added anywhere)."""
    table = np.zeros((LOGIT_BIAS_MAX, 2), np.uint32)
    table[:, 0] = n_unused
    table[:, 1] = np.float32(1.0).view(np.uint32)
    table[:len(ids), 0] = ids
    table[:len(ids), 1] = np.asarray(bias, np.float32).view(np.uint32)
    return table


@pytest.mark.parametrize("n,count", [(50, 50), (1000, 17), (1000, 0), (VOCAB_27B, LOGIT_BIAS_MAX)])
def test_logit_bias_adds_the_entries_to_every_row(dev, lib, n, count):
    # One sequence's rows (decode, or verify rows) share its table.
    rng = seeded("logit_bias", n, count)
    rows = 3
    logits = rng.standard_normal((rows, n)).astype(np.float32) * 4
    ids = rng.choice(n, size=count, replace=False)
    bias = rng.uniform(-100, 100, count).astype(np.float32)
    bias[:2] = [-100.0, 100.0][:count]
    want = logits.copy()
    want[:, ids] += bias
    got = run_logit_bias(dev, lib, logits, bias_table(ids, bias, n + int(rng.integers(0, 5))))
    np.testing.assert_array_equal(got, want)


def test_logit_bias_then_token_mask(dev, lib):
    # The engine's order: bias, then the mask; a refused token stays -inf whatever its bias.
    n = 512
    rng = seeded("bias_then_mask")
    logits = rng.standard_normal((1, n)).astype(np.float32)
    ids = np.arange(0, n, 5)
    biased = run_logit_bias(dev, lib, logits, bias_table(ids, np.full(ids.size, 100.0), n), pad=0)
    allowed = np.zeros((1, n), bool)
    allowed[0, ::2] = True
    got = run_token_mask(dev, lib, biased, pack_mask(allowed, n // 32), n // 32, pad=0)
    want = logits.copy()
    want[0, ids] += 100.0
    want[~allowed] = -np.inf
    np.testing.assert_array_equal(got, want)
    assert run_argmax(dev, lib, got, chunk=128)[0] % 10 == 0  # a biased, allowed id (multiple of 5 and of 2)

"""Speculative decoding on each test device: verify steps give exactly plain decoding's tokens
(greedy) and its distribution (sampling), whoever drafts.

Random tiny models accept almost no real drafts, so the drafters here are test hooks: an
oracle drafting the known plain continuation (every draft accepted: multi-token acceptance),
one that drafts it wrong at a chosen depth (rejection, rollback and K/V overwrite at each
depth), and prompt lookup on the "repetitive" checkpoint (model_fixtures: the next token
depends almost only on the current one), fed a prompt that quotes the chain the model is
about to produce, as a code edit quotes the file. Prompts are long enough that the context
crosses the flash-decode split length (128) while decoding.
"""

from __future__ import annotations

import numpy as np
import pytest

import metalqwen
from metalqwen import _core, speculative as spec
from metalqwen._core import Sampling

from ..support.model_checks import prompt

# Long tests that share only the session fixtures and a module checkpoint quick to make again: xdist
# may give each to a free worker.
pytestmark = pytest.mark.spread

TOKENS = 40
CONTEXT = 320


class Oracle:
    """Drafts the known continuation of `prompt_len` tokens, wrong at depth `wrong_at`
    (1-based, cycling through 1..period when "cycle": depths past the drafts are never wrong) or never."""

    def __init__(self, continuation, prompt_len, wrong_at=None, period=4):
        self.continuation, self.prompt_len, self.wrong_at, self.period = continuation, prompt_len, wrong_at, period
        self.steps, self.asked = 0, []

    def draft(self, history, k):
        done = len(history) - self.prompt_len
        drafts = list(self.continuation[done:done + k])
        wrong = (self.steps % self.period) + 1 if self.wrong_at == "cycle" else self.wrong_at
        self.steps += 1
        self.asked.append(k)
        if wrong is not None and wrong <= len(drafts):
            drafts[wrong - 1] = (drafts[wrong - 1] + 1) % 1024
        return drafts


_models: dict = {}


def load(converted, device, name: str, kv_bits: int) -> metalqwen.Model:
    key = (device.kind, name, kv_bits)
    if key not in _models:
        # The prefix cache spares the tests' repeated prompts a second prefill.
        _models[key] = metalqwen.load(converted(name)[1], device=device, max_context=CONTEXT, kv_bits=kv_bits,
                                      progress=False, speculative="lookup", draft_depth=4,
                                      prefix_cache_bytes=1 << 26)
    return _models[key]


_quoting: dict = {}


def quoting_prompt(m: metalqwen.Model) -> list[int]:
    """A prompt holding the chain the repetitive model produces after its last tokens."""
    if m not in _quoting:
        chain = m.generate([5], max_tokens=48, speculative="off").tokens
        _quoting[m] = chain + prompt(m.config.vocab_size, 70, seed=1) + chain[:3]
    return _quoting[m]


@pytest.mark.parametrize("kv_bits", [8, 16])
def test_greedy_speculation_gives_plain_greedy_tokens(converted, device, kv_bits):
    m = load(converted, device, "base", kv_bits)
    ids = prompt(m.config.vocab_size, 110, seed=kv_bits)
    plain = m.generate(ids, max_tokens=TOKENS, speculative="off")
    assert len(plain.tokens) == TOKENS and plain.stats.verify_steps == 0

    every = m.generate(ids, max_tokens=TOKENS, speculative=Oracle(plain.tokens, len(ids)))
    assert every.tokens == plain.tokens
    s = every.stats
    assert s.accepted == s.drafted > 0 and s.acceptance_at == [1.0] * 4
    assert s.verify_steps < TOKENS // 3 and s.tokens_per_verify_step > 3  # several tokens per step

    wrong = m.generate(ids, max_tokens=TOKENS, speculative=Oracle(plain.tokens, len(ids), wrong_at="cycle"))
    assert wrong.tokens == plain.tokens
    s = wrong.stats
    # Every depth is drafted and sometimes rejected; a wrong first draft rejects them all.
    assert s.drafted_at[0] > s.drafted_at[3] > 0 and s.accepted < s.drafted
    assert 0.0 < s.acceptance_at[0] < 1.0 and all(a < 1.0 for a in s.acceptance_at), s.acceptance_at


# Lookup and MTP drafting do not depend on the cache's format; verify rows over both formats are
# the greedy test's.
def test_prompt_lookup_accepts_quoted_spans_and_keeps_the_tokens(converted, device):
    m = load(converted, device, "repetitive", 8)
    ids = quoting_prompt(m)
    plain = m.generate(ids, max_tokens=TOKENS, speculative="off")
    looked = m.generate(ids, max_tokens=TOKENS, speculative="lookup")
    assert looked.tokens == plain.tokens
    s = looked.stats
    assert s.accepted >= 20 and s.tokens_per_verify_step > 2, s
    assert s.engine["verify_steps"] >= s.verify_steps > 0


def test_moe_verify_rows_give_plain_greedy_tokens(converted, device):
    m = load(converted, device, "moe", 16)
    ids = prompt(m.config.vocab_size, 30, seed=3)
    plain = m.generate(ids, max_tokens=32, speculative="off")
    oracle = m.generate(ids, max_tokens=32, speculative=Oracle(plain.tokens, len(ids), wrong_at="cycle"))
    assert oracle.tokens == plain.tokens and oracle.stats.accepted > 0


# ---------------------------------------------------------------------------- deep verify steps (16 drafts)


def deep(converted, device, name: str, kv_bits: int) -> metalqwen.Model:
    """The checkpoint loaded for 16 drafts per step: verify steps of up to 17 rows (the deep tier)."""
    key = (device.kind, name, kv_bits, "deep")
    if key not in _models:
        _models[key] = metalqwen.load(converted(name)[1], device=device, max_context=CONTEXT, kv_bits=kv_bits,
                                      progress=False, speculative="lookup", draft_depth=spec.MAX_DEPTH)
    return _models[key]


def test_sixteen_drafts_are_accepted_and_rolled_back_at_every_depth(converted, device):
    """A DFlash-sized verify step (16 drafts, 17 rows) right for k drafts then wrong, for every k:
    it returns the k accepted drafts and plain decoding's next token, rolls the DeltaNet states
    back to row k and leaves rows past it in the K/V cache to be rewritten, so a verify step from
    there (2 drafts, right) continues plain decoding's tokens. The context crosses the
    flash-decode split (128) inside the steps."""
    m = deep(converted, device, "base", 16)
    engine, vocab = m._engine, m.config.vocab_size
    assert spec.MAX_DEPTH == 16 and engine.max_step_rows == 17
    ids = prompt(vocab, 110, seed=16)
    plain = m.generate(ids, max_tokens=21, speculative="off").tokens
    snapshots = []
    engine.reset(0)
    engine.prefill(0, ids, snapshot_at=[len(ids)], snapshots=snapshots)
    assert engine.chosen(0) == plain[0]
    for k in range(17):
        engine.restore(0, snapshots[0])
        drafts = list(plain[1:17])
        if k < 16:
            drafts[k] = (drafts[k] + 1) % vocab
        assert engine.verify(0, drafts) == plain[1:k + 2], f"wrong at draft {k + 1}"
        assert engine.verify(0, plain[k + 2:k + 4]) == plain[k + 2:k + 5], f"the step after {k} accepted drafts"
    c = m.counters()
    assert c["drafted_at"][15] >= 17 and c["accepted_at"][15] >= 1


def test_the_memory_estimate_counts_the_deep_snapshot_planes(demo):
    """Each draft reserves a copy of every DeltaNet state per slot; 8 drafts or more also widen
    the step to 17 rows, which grows each DeltaNet layer's conv ring by 9 positions per slot and
    the split partials and verify choices by 9 rows. The estimate load checks counts it all."""
    desc = metalqwen.load_checkpoint(demo).describe()
    d = desc["dims"]

    def workspace(max_draft, slots=1):
        return _core.estimate_memory(d, desc["tensors"], 256, 8, 32, max_sequences=slots,
                                     max_draft=max_draft)["workspace"]

    def aligned(n):  # a slot's part of a per-slot buffer (kSlotAlign)
        return -(-n // 256) * 256

    delta = sum(kind == "linear_attention" for kind in d["layer_types"])
    plane = d["linear_num_value_heads"] * 128 * 128 * 4  # one DeltaNet state [nv][128][128] f32
    assert delta > 0
    assert workspace(16) - workspace(9) == 7 * delta * plane
    assert workspace(16, slots=3) - workspace(9, slots=3) == 3 * 7 * delta * plane
    assert workspace(7) - workspace(4) == 3 * delta * plane  # the small tier: the planes alone
    channels = (2 * d["linear_num_key_heads"] + d["linear_num_value_heads"]) * 128
    ring = aligned((d["linear_conv_kernel_dim"] - 1 + 17) * channels * 4) - aligned(
        (d["linear_conv_kernel_dim"] - 1 + 8) * channels * 4)
    partials = 9 * d["num_attention_heads"] * 64 * (256 + 2) * 4  # part_o and part_ms, 64 splits
    assert workspace(8) - workspace(7) == delta * (plane + ring) + partials + 9 * 4


class Deepest(spec.DepthPolicy):
    """Always the deepest step the engine holds (the policy would go there only gradually)."""

    def depth(self) -> int:
        return self.max_depth


@pytest.mark.parametrize("name, kv_bits", [("moe", 8)])  # dense f16: the test above
def test_greedy_speculation_at_depth_16_gives_plain_greedy_tokens(converted, device, name, kv_bits):
    """spec.generate (Model.generate's loop) at 16 drafts per step, wrong at depth 1, 2, ..., 16
    in turn and sometimes never: exactly plain decoding's tokens (MoE, q8 KV)."""
    m = deep(converted, device, name, kv_bits)
    engine = m._engine
    ids = prompt(m.config.vocab_size, 100, seed=kv_bits)
    plain = m.generate(ids, max_tokens=40, speculative="off").tokens
    engine.reset(0)
    engine.prefill(0, ids)
    drafter = Oracle(plain, len(ids), wrong_at="cycle", period=17)
    got = list(spec.generate(engine, 0, engine.chosen(0), 40, Sampling(), drafter, Deepest(spec.MAX_DEPTH),
                             list(ids)))
    assert got == plain
    assert drafter.steps > 3 and drafter.asked[0] == 16


def chi_square_bound(dof: int) -> float:
    """Above the 1e-4 upper quantile of chi-square with ``dof`` <= 11 degrees of freedom."""
    return dof + 4.3 * np.sqrt(2 * max(dof, 1)) + 12


def assert_fits_distribution(counts, p, what: str) -> None:
    """Counts of draws against probabilities ``p``: tokens expected >= 5 times each a category,
    the rest pooled (expected or not: a draw the distribution does not allow counts there)."""
    expected = counts.sum() * p
    big = expected >= 5
    observed = np.append(counts[big], counts[~big].sum())
    wanted = np.append(expected[big], expected[~big].sum())
    keep = wanted > 0
    assert observed[~keep].sum() == 0, f"{what}: draws outside the distribution"
    chi2 = float(((observed[keep] - wanted[keep]) ** 2 / wanted[keep]).sum())
    dof = int(keep.sum()) - 1
    assert chi2 < chi_square_bound(dof), f"{what}: chi2 {chi2:.1f} ({dof} dof): {observed} vs {wanted.round(1)}"


def test_sampled_sixteen_row_steps_have_the_plain_distribution_at_deep_rows(converted, device):
    """Sampled verify steps of 16 rows (15 drafts: a DFlash block, the deep matvec tier), drafts the
    greedy chain: at each row the choice, given that the drafts before it were accepted, follows
    the model's own distribution there (the point-mass rule: accepted with p(draft), else a draw
    without it). The "repetitive" model at temperature 0.04 is near-deterministic at most rows;
    the window used is the one whose random rows lie deepest (rows >= 9) with the most draws
    reaching them. Power, with 32 draws (a 16-row step takes seconds on the CPU runtime): every
    choice must lie in its row's support, so a choice from another row's logits or counter shows
    at the near-deterministic rows at once; pooled over the deep random rows, the count of choices
    other than the draft (about 16 expected, sd 3.5) must be within 4 sd: accepting every draft
    (about 1 such choice) fails that, never accepting one fails the near-deterministic rows'
    checks at the first draw; biases of a few percent go unseen."""
    m = deep(converted, device, "repetitive", 16)
    engine, vocab, T, draws = m._engine, m.config.vocab_size, 0.04, 32
    ids = prompt(vocab, 12, seed=1)
    chain = m.generate(ids, max_tokens=60, speculative="off").tokens
    logits = m.score(ids + chain).astype(np.float64)[len(ids) - 1:]  # row i: chain[i]'s distribution
    p = np.exp((logits - logits.max(axis=1, keepdims=True)) / T)
    p /= p.sum(axis=1, keepdims=True)
    top = p.max(axis=1)

    def deep_draws(s):  # expected draws (of one) reaching a row >= 9 that is random there
        reach, mass = 1.0, 0.0
        for r in range(16):
            mass += reach * (1 - top[s + 1 + r]) if r >= 9 else 0.0
            reach *= top[s + 1 + r]
        return mass

    s = max(range(len(chain) - 17), key=deep_draws)
    assert deep_draws(s) > 0.4, f"the fixture has no window random at deep rows ({deep_draws(s):.2f})"
    snapshots = []
    engine.reset(0)
    engine.prefill(0, ids + chain[:s], snapshot_at=[len(ids) + s], snapshots=snapshots)
    assert engine.chosen(0) == chain[s]
    counts = np.zeros((16, vocab), np.int64)
    for seed in range(draws):
        engine.restore(0, snapshots[0])
        out = engine.verify(0, chain[s + 1:s + 16], Sampling(temperature=T, seed=seed))
        assert out[:-1] == chain[s + 1:s + len(out)]  # accepted drafts, then a choice
        for r, token in enumerate(out):
            assert p[s + 1 + r, token] > 1e-9, f"row {r}: token {token} has probability {p[s + 1 + r, token]:.2g}"
            counts[r, token] += 1
    for r in range(16):
        if counts[r].sum() >= 10:
            assert_fits_distribution(counts[r], p[s + 1 + r], f"row {r}")
    deep_random = [r for r in range(9, 16) if top[s + 1 + r] < 0.95]
    visits = counts[deep_random].sum(axis=1)
    other = sum(visits[i] - counts[r, chain[s + 1 + r]] for i, r in enumerate(deep_random))
    q = 1 - top[[s + 1 + r for r in deep_random]]
    expected, sd = float((visits * q).sum()), float(np.sqrt((visits * q * (1 - q)).sum()))
    assert expected >= 8, (deep_random, visits)  # the window reaches its deep random rows
    assert abs(other - expected) < 4 * sd, (other, expected, sd, deep_random, visits)


def test_speculation_stops_at_max_tokens_and_at_the_context_end(converted, device):
    m = load(converted, device, "repetitive", 8)
    ids = quoting_prompt(m)
    plain = m.generate(ids, max_tokens=7, speculative="off").tokens
    for n in (1, 2, 7):  # a verify step never returns more than the budget left
        got = m.generate(ids, max_tokens=n, speculative=Oracle(plain, len(ids)))
        assert got.tokens == plain[:n]
    # Up to the last position of the context: drafts are trimmed to the room left.
    short = metalqwen.load(converted("repetitive")[1], device=device, max_context=len(ids) + 10, kv_bits=8,
                           progress=False, speculative="lookup", draft_depth=4, prefix_cache_bytes=1 << 26)
    plain = short.generate(ids, max_tokens=64, speculative="off")
    assert len(plain.tokens) == 10 and plain.stats.context_full
    looked = short.generate(ids, max_tokens=64, speculative=Oracle(plain.tokens, len(ids)))
    assert looked.tokens == plain.tokens and looked.stats.context_full and looked.stats.accepted > 0


def test_sampled_speculation_has_the_plain_distribution(converted, device):
    """The first sampled token (verified against a draft) and the one after an accepted
    draft follow plain sampling's distribution: chi-square against the model's own
    probabilities (temperature 1, top-k 4) over 200 seeds."""
    m = load(converted, device, "base", 16)
    engine, vocab = m._engine, m.config.vocab_size
    ids = prompt(vocab, 12, seed=5)
    engine.reset(0)
    engine.prefill(0, ids)  # greedy: the first token is fixed
    first = engine.chosen(0)
    snapshots = []
    engine.reset(0)
    engine.prefill(0, ids, snapshot_at=[len(ids)], snapshots=snapshots)
    def top4(logits):
        logits = logits.astype(np.float64)
        p = np.where(logits >= np.sort(logits)[-4], np.exp(logits - logits.max()), 0.0)
        return p / p.sum()

    def assert_fits(counts, p):
        assert counts[p == 0].sum() == 0
        expected = counts.sum() * p[p > 0]
        chi2 = float(((counts[p > 0] - expected) ** 2 / expected).sum())
        assert chi2 < 3 + 4.3 * np.sqrt(6) + 12, (chi2, counts[p > 0], expected.round(1))  # dof 3: past quantile 1e-4

    p = top4(m.score(ids + [first])[-1])
    draft = int(np.argsort(p)[-2])  # the second most likely: accepted about p(draft) of the time
    after = top4(m.score(ids + [first, draft])[-1])
    counts, counts_after = np.zeros(vocab, np.int64), np.zeros(vocab, np.int64)
    for seed in range(200):
        engine.restore(0, snapshots[0])
        got = engine.verify(0, [draft], Sampling(temperature=1.0, top_k=4, seed=seed))
        assert (got[0] == draft) == (len(got) == 2)  # an accepted draft brings the token after it
        counts[got[0]] += 1
        if len(got) == 2:
            counts_after[got[1]] += 1
    assert_fits(counts, p)
    assert counts_after.sum() > 20
    assert_fits(counts_after, after)
    engine.restore(0, snapshots[0])
    once = engine.verify(0, [draft], Sampling(temperature=1.0, top_k=4, seed=11))
    engine.restore(0, snapshots[0])
    assert engine.verify(0, [draft], Sampling(temperature=1.0, top_k=4, seed=11)) == once  # a seed reproduces


def test_sampled_generation_is_reproducible_for_a_seed(converted, device):
    m = load(converted, device, "repetitive", 8)
    ids = quoting_prompt(m)
    a = m.generate(ids, max_tokens=24, temperature=0.7, top_k=20, seed=42, speculative="lookup")
    b = m.generate(ids, max_tokens=24, temperature=0.7, top_k=20, seed=42, speculative="lookup")
    assert a.tokens == b.tokens and a.stats.verify_steps > 0


def test_penalties_decode_plainly(converted, device):
    m = load(converted, device, "repetitive", 8)
    ids = quoting_prompt(m)
    got = m.generate(ids, max_tokens=8, repetition_penalty=1.2, speculative="lookup")
    assert got.stats.verify_steps == 0
    assert got.tokens == m.generate(ids, max_tokens=8, repetition_penalty=1.2, speculative="off").tokens


def test_arguments_are_checked(converted, device):
    path = converted("base")[1]
    with pytest.raises(ValueError, match="speculative must be"):
        metalqwen.load(path, device=device, speculative="medusa")
    with pytest.raises(ValueError, match="draft_depth must be an integer in 1..16"):
        metalqwen.load(path, device=device, speculative="lookup", draft_depth=17)
    plain = metalqwen.load(path, device=device, max_context=64, progress=False)
    with pytest.raises(ValueError, match="reserved at load"):
        plain.stream([1, 2, 3], speculative="lookup")
    m = load(converted, device, "base", 8)
    with pytest.raises(TypeError, match="draft\\(history, k\\)"):
        m.stream([1, 2, 3], speculative=42)
    with pytest.raises(ValueError, match="speculative must be"):
        m.stream([1, 2, 3], speculative="auto-ish")


# ---------------------------------------------------------------------------- the drafter and the policy


def test_prompt_lookup_drafts_what_followed_the_latest_longest_match():
    look = spec.PromptLookup(max_ngram=3, min_ngram=2)
    history = [1, 2, 3, 4, 5, 9, 2, 3, 4, 7, 8, 1, 2, 3]
    # (2, 3) last occurred before "4, 7, 8"; the 3-gram (1, 2, 3) before "4, 5, 9": the longer wins.
    assert look.draft(history, 3) == [4, 5, 9]
    history += [4, 5]
    assert look.draft(history, 2) == [9, 2]  # (3, 4, 5) -> 9 ...
    assert spec.PromptLookup().draft([1, 2, 3, 4, 5, 6, 7], 4) == []  # nothing repeats: no drafts


def test_policy_goes_deep_on_high_acceptance():
    policy = spec.DepthPolicy(max_depth=4)
    for _ in range(40):
        k = policy.depth()
        policy.update(k, k)  # everything accepted
    assert policy.depth() == 4 and policy.speedup(4) > 3


def test_policy_turns_itself_off_then_probes_again():
    policy = spec.DepthPolicy(max_depth=4, pause=16, max_pause=128)
    depths, pauses = [], []
    for _ in range(40):
        depths.append(policy.depth())
        if depths[-1]:
            policy.update(depths[-1], 0)  # nothing accepted
        else:
            pauses.append(policy.plain_tokens())
    assert depths[0] == 4
    assert depths.index(0) <= 10, "a drafter that is never right is found out in a few steps"
    assert depths[-6:] in ([0, 1] * 3, [1, 0] * 3)  # off, probing at depth 1 after each pause
    assert pauses[:5] == [16, 32, 64, 128, 128], "each failed probe doubles the pause, up to max_pause"
    for _ in range(30):  # acceptance returns: depth climbs back
        k = policy.depth()
        if k:
            policy.update(k, k)
        else:
            policy.plain_tokens()
    assert policy.depth() == 4


def test_policy_weighs_the_measured_cost_of_a_verify_step():
    cheap, dear = spec.DepthPolicy(max_depth=3), spec.DepthPolicy(max_depth=3)
    for policy, verify_seconds in ((cheap, 1.05), (dear, 2.5)):
        policy.observe_plain(4, 4.0)  # 1 s per plain token
        for k in (1, 2, 3):
            policy.observe_verify(k, verify_seconds + 0.1 * k)
    assert cheap.cost(2) == pytest.approx(1.25) and dear.cost(2) == pytest.approx(2.7)
    # The prior acceptance (0.6) pays where a verify step costs about a plain one, not at 2.5x.
    assert cheap.depth() == 3 and dear.depth() == 0
    # Unmeasured: the model of rows nearly free.
    assert spec.DepthPolicy(max_depth=3).cost(2) == pytest.approx(1 + 2 * 0.04 + 0.03)


def test_a_verify_step_timed_below_a_plain_one_does_not_keep_a_never_right_drafter_on():
    # Plain tokens timed while the machine was busy (2 s) look dearer than verify steps (1 s):
    # the measured cost (0.5 plain steps) alone would make drafting pay at any acceptance.
    policy = spec.DepthPolicy(max_depth=4)
    policy.observe_plain(16, 32.0)
    for k in (1, 2, 3, 4):
        policy.observe_verify(k, 1.0)
    assert policy.cost(2) == pytest.approx(policy.modelled_cost(2)), "never below the model"
    depths = []
    while len(depths) < 40 and (not depths or depths[-1]):
        depths.append(policy.depth())
        if depths[-1]:
            policy.update(depths[-1], 0)  # nothing accepted
    assert depths[-1] == 0 and len(depths) <= 10, depths


class _NeverRight:
    """A drafter whose drafts are never accepted."""

    def __init__(self, vocab):
        self.vocab = vocab

    def draft(self, history, k):
        return [(history[-1] + 1 + i) % self.vocab for i in range(k)]


def test_a_drafter_that_is_never_right_costs_a_few_steps_and_changes_nothing(converted, device):
    m = load(converted, device, "base", 8)
    ids = prompt(m.config.vocab_size, 40, seed=5)
    plain = m.generate(ids, max_tokens=TOKENS, speculative="off")
    out = m.generate(ids, max_tokens=TOKENS, speculative=_NeverRight(m.config.vocab_size))
    assert out.tokens == plain.tokens
    s = out.stats
    # Rejections only (a draft equal to the plain token would be accepted; the stats say none was).
    assert s.accepted == 0 and 0 < s.verify_steps <= 10, (s.verify_steps, s.drafted)


def test_policy_picks_a_middle_depth_when_acceptance_falls_with_depth():
    policy = spec.DepthPolicy(max_depth=4, decay=0.0)  # the last step's outcome is the estimate
    policy.update(4, 1)  # first accepted, second rejected: a_1 = 1, a_2 = 0
    assert policy.depth() == 1
    policy.acceptance = [0.9, 0.8, 0.1, 0.1]
    assert policy.depth() == 2


# ---------------------------------------------------------------------------- MTP drafts


def _mtp_predicts_the_trunk(weights: dict) -> None:
    """An MTP head that, on the repetitive trunk, predicts what the trunk will: fc passes the
    normed embedding of x[t+1] through (fc = [I | 0]), its layer is quiet (mixer_gain), and
    mtp.norm is the trunk's final norm, so its logits are the trunk's at t + 1."""
    H = weights["model.norm.weight"].shape[0]
    weights["mtp.fc.weight"] = np.concatenate([np.eye(H), np.zeros((H, H))], axis=1).astype(np.float32)
    weights["mtp.pre_fc_norm_embedding.weight"] = np.zeros(H, np.float32)  # used as 1 + w
    weights["mtp.pre_fc_norm_hidden.weight"] = np.zeros(H, np.float32)
    weights["mtp.norm.weight"] = weights["model.norm.weight"].copy()


@pytest.fixture(scope="module")
def mtp_folder(tmp_path_factory):
    from ..support import model_fixtures as mf
    from metalqwen.convert import convert

    root = tmp_path_factory.mktemp("mtp-spec")
    hf = mf.write_hf_checkpoint(root / "hf", seed=11, tied=False, mtp=True, mixer_gain=1e-4,
                                edit=_mtp_predicts_the_trunk)
    return convert(hf, root / "mlx", bits=8, group_size=64)


def test_an_mtp_head_that_is_never_right_pauses_and_changes_nothing(tmp_path, device):
    from ..support import model_fixtures as mf
    from metalqwen.convert import convert

    # A random head on a random trunk: its drafts are (almost) never the trunk's tokens.
    folder = convert(mf.write_hf_checkpoint(tmp_path / "hf", seed=12, tied=False, mtp=True), tmp_path / "mlx",
                     bits=8, group_size=64)
    m = metalqwen.load(folder, device=device, max_context=CONTEXT, progress=False, speculative="mtp")
    ids = prompt(m.config.vocab_size, 40, seed=9)
    plain = m.generate(ids, max_tokens=TOKENS, speculative="off")
    out = m.generate(ids, max_tokens=TOKENS, speculative="mtp")
    assert out.tokens == plain.tokens
    s = out.stats
    assert s.acceptance < 0.2 and s.drafted <= 3 * 10, (s.verify_steps, s.drafted, s.accepted)
    # After the pause the head drafts again (its state rebuilt by one step), so the probes happen.
    assert s.drafted_at[0] > 1


def test_mtp_drafts_are_accepted_and_keep_the_tokens(mtp_folder, device):
    m = metalqwen.load(mtp_folder, device=device, max_context=CONTEXT, kv_bits=8, progress=False,
                       speculative="auto")
    assert m.speculative == "mtp" and m.draft_depth == spec.DEFAULT_MTP_DEPTH
    ids = prompt(m.config.vocab_size, 96, seed=7)
    plain = m.generate(ids, max_tokens=TOKENS, speculative="off")
    drafted = m.generate(ids, max_tokens=TOKENS, speculative="mtp")
    assert drafted.tokens == plain.tokens
    s = drafted.stats
    assert s.acceptance > 0.8 and s.tokens_per_verify_step > 2.5, (s.acceptance_at, s.tokens_per_verify_step)
    assert len(s.drafted_at) == 3 and s.drafted_at[2] > 0  # chained drafts at every depth
    # Sampled: a seed reproduces the output.
    a = m.generate(ids, max_tokens=16, temperature=0.8, top_k=20, seed=3, speculative="mtp")
    b = m.generate(ids, max_tokens=16, temperature=0.8, top_k=20, seed=3, speculative="mtp")
    assert a.tokens == b.tokens and a.stats.accepted > 0


def test_deep_mtp_steps_keep_the_tokens(mtp_folder, device):
    """12 chained MTP drafts per step: the head drafts, then runs over the step's 13 rows on the
    deep tier; the tokens are plain decoding's and the deep drafts are accepted."""
    m = metalqwen.load(mtp_folder, device=device, max_context=CONTEXT, kv_bits=16, progress=False,
                       speculative="mtp", draft_depth=12)
    engine = m._engine
    ids = prompt(m.config.vocab_size, 40, seed=8)
    plain = m.generate(ids, max_tokens=30, speculative="off").tokens
    engine.reset(0)
    engine.prefill(0, ids)
    got = [engine.chosen(0)]
    while len(got) < len(plain):
        got += engine.verify_mtp(0, min(12, len(plain) - len(got) - 1), Sampling())
    assert got == plain
    c = m.counters()
    assert c["drafted_at"][11] > 0 and c["accepted_at"][11] > 0, c["accepted_at"]


def test_mtp_mode_needs_a_head(converted, device):
    path = converted("base")[1]
    with pytest.raises(metalqwen.CheckpointError, match="speculative='mtp'"):
        metalqwen.load(path, device=device, speculative="mtp")
    assert metalqwen.load(path, device=device, max_context=64, speculative="auto").speculative == "lookup"
    with pytest.raises(ValueError, match="needs the MTP head"):
        load(converted, device, "base", 8).stream([1, 2, 3], speculative="mtp")


def test_cli_generate_reports_the_acceptance(mtp_folder, device, capfd):
    from ..support.cli import call

    r = call(capfd, "generate", "-m", mtp_folder, "--device", device.kind, "--raw", "-p", "Hello there",
             "--max-tokens", "12", "--max-context", "64", "--temperature", "0")
    assert r.returncode == 0, r.stderr
    assert "speculative (mtp): " in r.stderr and "tokens per step, acceptance" in r.stderr, r.stderr
    off = call(capfd, "generate", "-m", mtp_folder, "--device", device.kind, "--raw", "-p", "Hello there",
               "--max-tokens", "12", "--max-context", "64", "--speculative", "off", "--temperature", "0")
    assert off.returncode == 0 and off.stdout == r.stdout and "speculative" not in off.stderr


def test_bench_reports_tokens_per_verify_step_and_acceptance(mtp_folder, device, tmp_path, capfd):
    import json

    from ..support.cli import call

    out = tmp_path / "bench.json"
    r = call(capfd, "bench", "-m", mtp_folder, "--device", device.kind, "--quick", "--speculative", "mtp",
             "--json", str(out))
    assert r.returncode == 0, r.stderr
    s = json.loads(out.read_text())["metalqwen"]["speculative"]
    assert s["verify_steps"] > 0 and s["tokens_per_verify_step"] > 1.5 and s["acceptance"] > 0.5, s
    assert len(s["acceptance_by_depth"]) == spec.DEFAULT_MTP_DEPTH
    assert "tokens_per_verify_step" in r.stdout


def test_mtp_and_lookup_drafts_together_keep_the_tokens(mtp_folder, device):
    """The head drafts, and prompt lookup takes over on a quoted span: both kinds of step
    run, and the tokens are plain decoding's."""

    class Counting(spec.MtpHead):
        lookups = 0

        def draft(self, history, k):
            drafts = super().draft(history, k)
            self.lookups += bool(drafts)
            return drafts

    m = metalqwen.load(mtp_folder, device=device, max_context=CONTEXT, kv_bits=8, progress=False,
                       speculative="mtp")
    chain = m.generate([5], max_tokens=40, speculative="off").tokens
    ids = chain + prompt(m.config.vocab_size, 30, seed=2) + chain[:3]
    plain = m.generate(ids, max_tokens=TOKENS, speculative="off")
    drafter = Counting()
    both = m.generate(ids, max_tokens=TOKENS, speculative=drafter)
    assert both.tokens == plain.tokens
    assert 0 < drafter.lookups < both.stats.verify_steps  # some steps lookup's, the others the head's


def test_mtp_drafts_in_shared_steps_keep_each_sequences_tokens(mtp_folder, device):
    """Through the Scheduler (the server's path) each request with the head drafts its own
    chain on the GPU inside the shared step: every output is its plain decoding alone."""
    from metalqwen.batching import Scheduler

    class HeadOnly(spec.MtpHead):
        """The head's drafts only (prompt lookup never takes over)."""

        def draft(self, history, k):
            return []

    m = metalqwen.load(mtp_folder, device=device, max_context=CONTEXT, kv_bits=8, progress=False,
                       speculative="mtp", max_sequences=2)
    prompts = [prompt(m.config.vocab_size, n, seed=s) for n, s in ((24, 7), (12, 8))]
    plain = [m.generate(p, max_tokens=12, speculative="off").tokens for p in prompts]
    scheduler = Scheduler(m)
    seqs = [scheduler.submit(p, max_tokens=12, speculative=HeadOnly()) for p in prompts]
    before = m.counters()
    scheduler.run()
    after = m.counters()
    assert [s.output.tokens for s in seqs] == plain
    # Most drafts accepted, as alone (this head predicts the trunk): drafts from another slot's or
    # an older step's head state would be (almost) never right.
    for seq in seqs:
        s = seq.output.stats
        assert s.drafted > 0 and s.acceptance > 0.5 and s.verify_steps > 0, (s.drafted, s.accepted)
    assert after["drafted"] - before["drafted"] == sum(s.output.stats.drafted for s in seqs)
    with pytest.raises(RuntimeError, match=r"1 drafts given with 2 MTP drafts: given, they are the head's made "
                                           r"ahead \(mtp_drafts\), as many"):
        m._engine.step([(0, [1], Sampling(), 2)])

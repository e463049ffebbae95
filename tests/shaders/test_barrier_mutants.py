"""Barriers that the CPU runtime's index order used to make redundant are needed now: with
one removed, the kernel's own tests fail under a schedule CI runs (reverse, random:1).

Before schedules and per-lane simdgroup loads/stores, removing any of these passed every
test: the four simdgroup_barriers of attn_prefill, the threadgroup_barrier after
sample_top_kp resets cand_count, and tg_exclusive_scan's leading barrier (a write-after-read
reached only when a threshold falls inside more tied logits than the sampler can gather)."""

import pytest

from metalqwen import _core, gpu

from . import test_attention, test_sampling
from .conftest import checkout_shader_files

CI_SCHEDULES = ["reverse", "random:1"]


def without_barrier_after(text, anchor):
    """`text` without the barrier on the line after `anchor` (which must occur once)."""
    assert text.count(anchor) == 1, f"mutation anchor not found exactly once: {anchor!r}"
    start = text.index("\n", text.index(anchor) + len(anchor)) + 1
    end = text.index("\n", start) + 1
    assert "barrier(mem_flags::" in text[start:end], f"no barrier after {anchor!r}: {text[start:end]!r}"
    return text[:start] + text[end:]


def library(dev, file, anchor=None):
    """`file` as the engine compiles it, or with the barrier after `anchor` removed from its
    header (<file>.h holds the kernel bodies)."""
    files = {path: text for path, text in checkout_shader_files().items() if path.endswith(".h") or path == file}
    if anchor is not None:
        header = file.removesuffix(".metal") + ".h"
        files[header] = without_barrier_after(files[header], anchor)
    return dev.compile(_core.shader_library_source(files), file if anchor is None else f"mutant-{file}")


def prefill_checks():
    return [(test_attention.test_prefill, case) for case in test_attention.PREFILL_CASES]


def sampler_checks():
    return ([(test_sampling.test_sampler_threshold_inside_more_tied_logits_than_it_can_gather, case)
             for case in test_sampling.TIE_CASES] +
            [(test_sampling.test_sampler_matches_reference_bisection_paths, case)
             for case in test_sampling.LARGE_CASES] +
            [(test_sampling.test_sampler_matches_reference_small_vocab, case) for case in test_sampling.SMALL_CASES])


MUTANTS = [  # (file, the line before the removed barrier, the tests that must catch it)
    ("attention.metal", "simdgroup_store(s, scr, 8);", prefill_checks),
    ("attention.metal", "scr[i * 8 + 2 * cp + 1] = pb;", prefill_checks),
    ("attention.metal", "const float inv = 1.0f / l;\n  for (uint c = 0; c < HD / 8; c++) {", prefill_checks),
    ("attention.metal", "simdgroup_store(acc[c], scr, 8);", prefill_checks),
    ("sampling.metal", "if (tid == 0) atomic_store_explicit(&cand_count, 0u, memory_order_relaxed);", sampler_checks),
    ("sampling.metal", "const float group = simd_sum(v);", sampler_checks),
]


def first_failure(dev, lib, checks):
    """The first (test, case) that fails on `lib`, or None when all pass."""
    for test, case in checks:
        try:
            test(dev, lib, *case)
        except (AssertionError, gpu.GpuError):
            return test, case
    return None


@pytest.mark.parametrize("file,anchor,checks", MUTANTS,
                         ids=[f"{file}:{anchor.splitlines()[-1].strip()}" for file, anchor, _ in MUTANTS])
def test_removing_the_barrier_fails_a_test_under_a_ci_schedule(file, anchor, checks):
    for schedule in CI_SCHEDULES:
        dev = gpu.Device("cpu", schedule=schedule)
        failure = first_failure(dev, library(dev, file, anchor), checks())
        if failure:
            test, case = failure
            test(dev, library(dev, file), *case)  # control: the same check passes with the barrier
            return
    pytest.fail(f"no test fails under {CI_SCHEDULES} without the barrier after {anchor!r}")

"""Prompts with images through metalqwen.load on the tiny VLM folder, against mlx-vlm 0.7.10's
Qwen3.5 model run on the same ids and patches: logits at every position for one image and for two
images with text between them, greedy tokens, a text-only prompt on the VLM folder; and what is
refused. The reference runs every parameter in float32 (as the text path's mlx-lm reference,
tests/support/model_fixtures.reference_logits), so the tolerance is the text path's f16-cache one."""

from pathlib import Path

import numpy as np
import pytest

import metalqwen
from metalqwen.images import IMAGE_TEXT

from ..support.model_checks import assert_logits_close, logit_tolerance, up_to_eos
from .conftest import TOKEN_IDS, picture

PAD, START = TOKEN_IDS["image_token_id"], TOKEN_IDS["vision_start_token_id"]


@pytest.fixture(scope="module")
def folder(vlm):
    return vlm()


@pytest.fixture(scope="module")
def model(folder, device):
    return metalqwen.load(folder, device=device, max_context=256, kv_bits=16, progress=False,
                          prefix_cache_bytes=64 << 20, speculative="lookup", draft_depth=2)


def reference_of(folder):
    """mlx-vlm's model of the folder with float32 parameters (quantized modules keep their codes, their
    scales and biases in float32)."""
    import mlx.core as mx
    from mlx.utils import tree_map
    from mlx_vlm.utils import load_model

    m = load_model(Path(folder))
    m.update(tree_map(lambda p: p.astype(mx.float32) if mx.issubdtype(p.dtype, mx.floating) else p, m.parameters()))
    return m


@pytest.fixture(scope="module")
def reference(folder):
    return reference_of(folder)


def patches_of(model, images):
    rows, grids = zip(*(model.vision.patches(i) for i in images))
    return np.concatenate(rows), [list(g) for g in grids]


def reference_logits(reference, ids, rows, grids, cache=None):
    import mlx.core as mx

    out = reference(mx.array([ids]), pixel_values=mx.array(rows), image_grid_thw=mx.array(grids), cache=cache)
    return out.logits[0].astype(mx.float32)


def reference_greedy(reference, ids, rows, grids, n):
    """mlx-vlm's greedy tokens and the logits that chose them ([n, vocab]): the prompt with its
    images, then the language model token by token through its caches (as mlx-vlm's generate
    does: positions continue from its rope delta)."""
    import mlx.core as mx

    cache = reference.language_model.make_cache()
    logits = reference_logits(reference, ids, rows, grids, cache)
    out, rows_seen = [], []
    for _ in range(n):
        rows_seen.append(np.array(logits[-1]))
        out.append(int(mx.argmax(logits[-1]).item()))
        logits = reference.language_model(mx.array([[out[-1]]]), cache=cache).logits[0].astype(mx.float32)
    return out, np.stack(rows_seen)


ONE = dict(messages=None, text="Describe the picture.", images=[(64, 128)])
TWO = dict(messages=[{"role": "user", "content": [
    {"type": "image"}, {"type": "text", "text": "and then"}, {"type": "image"}, {"type": "text", "text": "compare."}]}],
    images=[(96, 64), (64, 64)])


# An image after a long text: the prompt's first prefill chunk (64 rows) holds text only, the image
# starts in the second.
LATE = dict(messages=[{"role": "user", "content": [
    {"type": "text", "text": "The quick brown fox jumps over the lazy dog. " * 3}, {"type": "image"},
    {"type": "text", "text": "What is it?"}]}], images=[(64, 96)])


def case(c):
    images = [picture(h, w, seed=h * w) for h, w in c["images"]]
    return (c["messages"] or c["text"]), images


@pytest.mark.parametrize("c", [ONE, TWO, LATE], ids=["one image first", "text between two images",
                                              "image after a long text"])
def test_logits_equal_mlx_vlm(model, reference, c):
    prompt, images = case(c)
    ids = model.prompt_ids(prompt, chat=True, images=images)
    assert c is not LATE or ids.index(PAD) > 64
    rows, grids = patches_of(model, images)
    assert ids.count(PAD) == sum(h * w // 4 for _, h, w in grids)
    got = model.score(prompt, images=images, chat=True)
    want = np.array(reference_logits(reference, ids, rows, grids))
    assert_logits_close(got, want, logit_tolerance(model.config, 16))


def test_a_quantized_tower_gives_mlx_vlm_logits(vlm, device):
    """A folder whose tower mlx_vlm.convert quantized with the language model (8 bits, group 32: every
    linear and the position grid): the prompt's logits equal mlx-vlm's."""
    folder = vlm(tower_quant=(8, 32))
    model = metalqwen.load(folder, device=device, max_context=128, kv_bits=16, progress=False)
    assert model.vision is not None
    prompt, images = case(TWO)
    ids = model.prompt_ids(prompt, chat=True, images=images)
    rows, grids = patches_of(model, images)
    want = np.array(reference_logits(reference_of(folder), ids, rows, grids))
    assert_logits_close(model.score(prompt, images=images, chat=True), want, logit_tolerance(model.config, 16))


def test_two_images_render_in_message_order(model):
    prompt, images = case(TWO)
    text = model.tokenizer.decode(model.prompt_ids(prompt, chat=True, images=images))
    assert text.index("and then") < text.index("compare.")
    assert text.count("<|vision_start|>") == 2 and text.index("<|vision_end|>") < text.index("and then")


def test_greedy_tokens_and_logprobs_equal_mlx_vlm(model, reference):
    """Decode steps after the image rotate at cache row + rope_delta: the tokens, and each one's
    log-probability against the reference's log-softmax (a decode at the cache row alone, delta
    0, is ~1e-2 of the logits off)."""
    prompt, images = case(ONE)
    ids = model.prompt_ids(prompt, chat=True, images=images)
    rows, grids = patches_of(model, images)
    chunks = list(model.stream(prompt, max_tokens=6, chat=True, images=images, logprobs=0))
    got = model.last_tokens
    want, logits = reference_greedy(reference, ids, rows, grids, 6)
    want = up_to_eos(want, model.eos_token_ids)
    assert got == want
    logprobs = [c.logprob for c in chunks if c.token is not None]
    shifted = logits - logits.max(1, keepdims=True)
    want_lp = (shifted - np.log(np.exp(shifted).sum(1, keepdims=True)))[np.arange(len(got)), got]
    # log-softmax moves by at most twice the largest logit error.
    bound = 2 * logit_tolerance(model.config, 16) * np.abs(logits).max()
    assert np.abs(np.array(logprobs) - want_lp).max() <= bound
    # The same prompt again (its only snapshot is its whole self, not a proper prefix) is fed whole
    # and gives the same tokens.
    again = model.generate(prompt, max_tokens=6, chat=True, images=images)
    assert again.tokens == got and again.stats.prompt_tokens_reused == 0


def answer(model, prompt, images, **options):
    """(tokens, each one's top-3 logprobs, prompt tokens reused) of a greedy run."""
    chunks = list(model.stream(prompt, max_tokens=4, images=images, logprobs=3, speculative="off", **options))
    return model.last_tokens, [(c.logprob, c.top_logprobs) for c in chunks if c.token], \
        model.last_stats.prompt_tokens_reused


def test_prefix_cache_keys_images_by_content(model):
    """A prompt that extends an earlier image prompt resumes from its snapshot when the picture is the
    same (each image's hash is in the key) and answers exactly as a cold run; the same text with
    another picture of the same size is not resumed."""
    img, other = picture(64, 96, seed=11), picture(64, 96, seed=12)
    base = model.tokenizer.encode_chat([{"role": "user", "content": IMAGE_TEXT + "Describe it."}])
    longer = base + model.tokenizer.encode("And the colours?")
    cold = answer(model, longer, [img])
    assert cold[2] == 0
    model.generate(base, max_tokens=2, images=[img])  # snapshots its whole prompt
    hit = answer(model, longer, [img])
    assert hit[2] == len(model.prompt_ids(base, images=[img])) and hit[:2] == cold[:2]
    assert answer(model, longer, [other])[2] == 0


def test_the_disk_cache_keys_images_by_content(model, folder, device, tmp_path):
    """As above across instances sharing a cache_dir: a new one resumes from the file an image prompt
    left, exactly, with the same picture only."""
    def load(cache_dir=str(tmp_path)):
        return metalqwen.load(folder, device=device, max_context=256, kv_bits=16, progress=False,
                              cache_dir=cache_dir)

    img, other = picture(64, 96, seed=11), picture(64, 96, seed=12)
    base = model.tokenizer.encode_chat([{"role": "user", "content": IMAGE_TEXT + "Describe it."}])
    longer = base + model.tokenizer.encode("And the colours?")
    cold = answer(load(None), longer, [img])
    writer = load()
    writer.generate(base, max_tokens=2, images=[img])  # a file of its whole prompt
    assert writer.prefix_cache.disk.flush(60) and writer.prefix_cache.disk.writes == 1
    resumed = load()
    hit = answer(resumed, longer, [img])
    assert hit[2] == len(resumed.prompt_ids(base, images=[img])) and hit[:2] == cold[:2]
    assert resumed.prefix_cache.disk.hits == 1
    assert answer(load(), longer, [other])[2] == 0


def test_a_snapshot_before_an_image_resumes_a_text_prompt(model):
    """A snapshot taken before the first image (here at the system prompt's end) carries that prefix's
    rotary delta (0), not the image prompt's: a text prompt resumed from it answers as a cold run."""
    system = {"role": "system", "content": "You look at pictures."}
    text = [system, {"role": "user", "content": "Say hello."}]
    cold = answer(model, text, [])
    assert cold[2] == 0
    at = len(model.tokenizer.encode(model.tokenizer.apply_chat_template([system], add_generation_prompt=False)))
    with_image = [system, {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]}]
    assert model.prompt_ids(with_image, images=[picture(64, 64, seed=13)])[:at] == model.prompt_ids(text)[:at]
    model.generate(with_image, max_tokens=2, images=[picture(64, 64, seed=13)], boundaries=[at])
    hit = answer(model, text, [])
    assert hit[2] == at and hit[:2] == cold[:2]


def test_a_conversation_with_a_picture_resumes_each_turn(model):
    """Conversation boundaries are positions with one pad per image; Model.request moves them past each
    image's rows, so the second turn resumes at the end of the first user turn (picture included) and
    answers as the same prompt does from a fresh state. The tower ran once for the picture: the
    second turn takes its cached features, and a cold run whose tower runs again answers the same."""
    from metalqwen.conversation import Conversation
    from metalqwen.images import image_tokens

    img = picture(64, 64, seed=14)
    conversation = Conversation(model.tokenizer, image_tokens=lambda p: image_tokens(*p.shape[:2],
                                                                                     model.vision.processor))
    runs = model.counters()["vision_tower_runs"]
    first = conversation.prompt("What is it?", [img])
    out = model.generate(first.ids, boundaries=first.boundaries, images=first.images, max_tokens=3)
    conversation.record(first, "What is it?", out.text, [img])
    second = conversation.prompt("And now?")
    reused = model.counters()["vision_features_reused"]
    hit = answer(model, second.ids, second.images, boundaries=second.boundaries)
    user_end = max(first.boundaries) + first.length - len(first.ids)  # past the picture's rows
    assert hit[2] == user_end
    counters = model.counters()
    assert counters["vision_tower_runs"] == runs + 1 and counters["vision_features_reused"] == reused + 1
    cache, model.runner.prefix_cache = model.runner.prefix_cache, None
    model.vision.clear_cache()
    try:
        cold = answer(model, second.ids, second.images)
    finally:
        model.runner.prefix_cache = cache
    assert model.counters()["vision_tower_runs"] == runs + 2
    assert cold[2] == 0 and cold[:2] == hit[:2]


def test_a_picture_given_twice_runs_the_tower_once(model):
    """The same picture twice in one prompt (and again in the next request) runs the tower once; the
    logits equal those of a run where the tower computes each image (no cache, no reuse)."""
    from metalqwen.vision import VisionTower

    img = picture(64, 96, seed=15)
    prompt = [{"role": "user", "content": [{"type": "image", "image": img}, {"type": "text", "text": "and"},
                                           {"type": "image", "image": img.copy()}]}]
    model.vision.clear_cache()
    before = model.counters()
    got = model.score(prompt)
    again = model.score(prompt)
    after = model.counters()
    assert after["vision_tower_runs"] - before["vision_tower_runs"] == 1
    assert after["vision_features_reused"] - before["vision_features_reused"] == 3
    tower, limit = model.vision, model.vision.cache_bytes
    tower.cache_bytes = 0
    tower.clear_cache()
    tower.prompt_features = lambda image, seen=None: VisionTower.prompt_features(tower, image)
    try:
        cold = model.score(prompt)
    finally:
        del tower.prompt_features
        tower.cache_bytes = limit
    assert model.counters()["vision_tower_runs"] - after["vision_tower_runs"] == 2
    assert np.array_equal(got, cold) and np.array_equal(again, cold)


def test_the_feature_cache_keeps_the_latest_pictures_within_its_bytes(model):
    tower, limit = model.vision, model.vision.cache_bytes
    one = 6 * tower.config.out_hidden_size * 4  # a 96 x 64 picture: 6 features of f32 [out_hidden]
    pictures = [picture(96, 64, seed=30 + i) for i in range(3)]
    tower.clear_cache()
    tower.cache_bytes = 2 * one
    try:
        for p in pictures:
            tower.prompt_features(p)
        runs = tower.runs
        tower.prompt_features(pictures[2])
        tower.prompt_features(pictures[1])
        assert tower.runs == runs
        tower.prompt_features(pictures[0])  # dropped: the least recently used
        assert tower.runs == runs + 1
    finally:
        tower.cache_bytes = limit


def test_the_tower_is_in_the_memory_estimate(model, folder):
    """weight_bytes (and so the load's memory estimate) counts the tower's tensors beside the language
    model's (all BF16 here: placed as stored)."""
    from metalqwen.checkpoint import load_checkpoint

    ck = load_checkpoint(folder)
    counters = model.counters()
    assert counters["weight_bytes"] == sum(t.nbytes for t in {**ck.tensors, **ck.vision}.values())
    assert counters["memory_estimate"] > counters["weight_bytes"]


def test_image_prompts_batch_as_each_alone(folder, device):
    """generate_batch over two slots with prompts of one and two pictures and a text one, in prefill
    chunks of 8 rows (images straddle chunks; later prompts join running steps): each answer equals
    that prompt's alone."""
    batched = metalqwen.load(folder, device=device, max_context=128, kv_bits=16, progress=False, max_sequences=2,
                             prefill_chunk=8)

    def user(*parts):
        return [{"role": "user", "content": [{"type": "image", "image": p} if isinstance(p, np.ndarray) else
                                             {"type": "text", "text": p} for p in parts]}]

    prompts = [user(picture(64, 96, seed=21), "What is it?"),
               user("Compare", picture(96, 64, seed=22), "with", picture(64, 64, seed=23)),
               user("No picture here."), user(picture(64, 64, seed=24), "And this?")]
    alone = [batched.generate(p, max_tokens=5, enable_thinking=False).tokens for p in prompts]
    together = batched.generate_batch(prompts, 5, enable_thinking=False)
    assert [g.tokens for g in together] == alone


class RepeatLast:
    """Drafts the last token k times: every step is a verify step, most drafts refused."""

    def draft(self, history, k):
        return [history[-1]] * k


def test_chunked_prefill(model, folder, device):
    """Prefill chunks of 16 rows (the second image straddles rows 15 | 16) bind each chunk's
    positions and features and give the one-chunk logits."""
    chunked = metalqwen.load(folder, device=device, max_context=64, kv_bits=16, progress=False, prefill_chunk=16)
    prompt, images = case(TWO)
    ids = chunked.prompt_ids(prompt, images=images)
    assert ids[15] == ids[16] == PAD and ids[14] == START  # an image across the chunk boundary
    want = model.score(prompt, images=images)
    np.testing.assert_allclose(chunked.score(prompt, images=images), want, rtol=0, atol=1e-4 * np.abs(want).max())


def test_speculation_after_an_image(model):
    """Verify steps rotate at cache row + rope_delta: plain greedy's tokens."""
    prompt, images = case(TWO)
    plain = model.generate(prompt, max_tokens=5, images=images, speculative="off").tokens
    spec = model.generate(prompt, max_tokens=5, images=images, speculative=RepeatLast())
    assert spec.tokens == plain and spec.stats.verify_steps > 0


def test_a_text_prompt_on_the_vlm_folder_is_the_text_path(model, reference):
    import mlx.core as mx

    ids = model.prompt_ids("Just text, no picture.", chat=True)
    want = np.array(reference(mx.array([ids])).logits[0].astype(mx.float32))
    assert_logits_close(model.score(ids), want, logit_tolerance(model.config, 16))


def test_images_in_ids_and_content_parts(model, tmp_path):
    """An image_url part with a data: URL, and an ids prompt (one image per
    <|vision_start|><|image_pad|><|vision_end|>) with the picture as a path, give the logits of the
    same picture passed as an array."""
    import base64
    import io

    from PIL import Image

    img = picture(64, 64, seed=3)
    png = io.BytesIO()
    Image.fromarray(img).save(png, format="PNG")
    path = tmp_path / "p.png"
    path.write_bytes(png.getvalue())
    want = model.score("What is it?", images=[img], chat=True)
    url = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                             {"type": "text", "text": "What is it?"}]}]
    assert np.array_equal(model.score(messages), want)
    ids = model.tokenizer.encode_chat([{"role": "user", "content": IMAGE_TEXT + "What is it?"}])
    assert np.array_equal(model.score(ids, images=[str(path)]), want)


def test_what_is_refused(model, demo, device):
    img = picture(64, 64)
    with pytest.raises(ValueError, match="2 images given but the prompt has places for 1"):
        model.score(model.tokenizer.encode(IMAGE_TEXT + "x"), images=[img, img])
    with pytest.raises(ValueError, match="image places .* but no images"):
        model.score(model.tokenizer.encode(IMAGE_TEXT + "x"))
    with pytest.raises(ValueError, match="fetching URLs is not supported"):
        model.score([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}])
    text_only = metalqwen.load(demo, device=device, max_context=64, progress=False)
    assert text_only.vision is None
    with pytest.raises(ValueError, match="takes no images: .*has no vision tower"):
        text_only.generate("What is it?", max_tokens=2, images=[img])


def test_cli_generate_with_images_answers_as_the_python_api(model, folder, device, tmp_path, capfd):
    from PIL import Image

    from ..support.cli import call

    paths = []
    for seed in (3, 4):
        paths.append(str(tmp_path / f"p{seed}.png"))
        Image.fromarray(picture(64, 64, seed=seed)).save(paths[-1])
    want = model.generate("What differs?", max_tokens=3, images=paths, chat=True, enable_thinking=False)
    out = call(capfd, "generate", "-m", folder, "--device", device.kind, "--image", paths[0], "--image", paths[1],
               "-p", "What differs?", "--max-tokens", "3", "--temperature", "0", "--no-think", "--speculative", "off")
    assert out.returncode == 0, out.stderr
    assert out.stdout == want.text + "\n"
    missing = call(capfd, "generate", "-m", folder, "--image", str(tmp_path / "none.png"), "-p", "x")
    assert missing.returncode == 1 and "--image" in missing.stderr and "none.png: no such file" in missing.stderr


def test_cli_chat_attaches_an_image_to_the_next_message(model, folder, device, tmp_path):
    """/image PATH goes with the next message; the second turn reads the picture again (its prompt
    holds the image tokens), and both answers are the Python API's on the same conversation."""
    from PIL import Image

    from ..support.cli import run

    path = str(tmp_path / "chat.png")
    Image.fromarray(picture(64, 96, seed=5)).save(path)
    first = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}]
    one = model.generate(first, max_tokens=3, images=[path], enable_thinking=False)
    second = first + [{"role": "assistant", "content": one.text.lstrip("\n"), "reasoning_content": None},
                      {"role": "user", "content": "And now?"}]
    two = model.generate(second, max_tokens=3, images=[path], enable_thinking=False)
    out = run("chat", "-m", folder, "--device", device.kind, "--max-tokens", "3", "--temperature", "0", "--no-think",
              "--speculative", "off", stdin=f"/help\n/image {tmp_path}/none.png\n/image {path}\nWhat is it?\nAnd now?\n")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert "/image PATH attaches a picture" in out.stderr and "(cannot attach" in out.stderr and "none.png" in out.stderr
    assert f"(attached {path}: 96 x 64, 6 prompt tokens" in out.stderr
    assert f"> {one.text}\n> {two.text}\n" in out.stdout, out.stdout
    reports = [line for line in out.stderr.splitlines() if line.startswith("prompt: ")]
    assert [int(r.split()[1]) for r in reports] == [one.stats.prompt_tokens, two.stats.prompt_tokens]

"""Chat messages with OpenAI content parts flattened to Qwen's vision tokens (images.py), the image
order, URLs, and the expansion of each image's pad (no GPU)."""

import base64

import pytest

from metalqwen.images import IMAGE_TEXT, ImageTokens, expand, flatten_messages, image_from_url

TOKENS = ImageTokens(pad=7, start=5, end=6)


def test_parts_flatten_in_order_and_leftover_images_go_first_in_the_last_user_message(tmp_path):
    path = tmp_path / "a.png"
    path.write_bytes(b"png")
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "image", "image": "VALUE"}, {"type": "text", "text": "first"}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "then"}, {"type": "image"},
                                     {"type": "image_url", "image_url": {"url": f"file://{path}"}}]},
    ]
    out, images = flatten_messages(messages, ["A", "B"])
    assert [m["content"] for m in out] == ["Be brief.", IMAGE_TEXT + "first", "ok",
                                           IMAGE_TEXT + "then" + IMAGE_TEXT + IMAGE_TEXT]
    # VALUE (message 1), then B (left over: first in the last user message), A (its image part), the file.
    assert images == ["VALUE", "B", "A", str(path)]
    assert messages[1]["content"][0] == {"type": "image", "image": "VALUE"}  # the caller's messages unchanged


def test_a_text_message_with_images_puts_them_first():
    out, images = flatten_messages([{"role": "user", "content": "Describe."}], ["A"])
    assert out == [{"role": "user", "content": IMAGE_TEXT + "Describe."}] and images == ["A"]


def test_urls():
    assert image_from_url("data:image/png;base64," + base64.b64encode(b"\x89PNG").decode()) == b"\x89PNG"
    with pytest.raises(ValueError, match="fetching URLs is not supported"):
        image_from_url("https://example.com/a.png")
    with pytest.raises(ValueError, match="not valid base64"):
        image_from_url("data:image/png;base64,@@@")
    with pytest.raises(ValueError, match="must be base64"):
        image_from_url("data:image/png,abc")
    with pytest.raises(ValueError, match="is not a file"):
        image_from_url("file:///no/such/picture.png")


def test_parts_that_are_refused():
    with pytest.raises(ValueError, match="more image parts without an image than images= gives"):
        flatten_messages([{"role": "user", "content": [{"type": "image"}]}])
    with pytest.raises(ValueError, match="expected type text, image_url or image"):
        flatten_messages([{"role": "user", "content": [{"type": "audio"}]}])
    with pytest.raises(ValueError, match="needs a user message"):
        flatten_messages([{"role": "system", "content": "x"}], ["A"])


def test_expand_repeats_each_pad_per_feature_row():
    ids = [1, 5, 7, 6, 2, 5, 7, 6, 3]
    assert expand(ids, [2, 3], TOKENS) == [1, 5, 7, 7, 6, 2, 5, 7, 7, 7, 6, 3]
    with pytest.raises(ValueError, match="1 images given but the prompt has places for 2"):
        expand(ids, [2], TOKENS)
    with pytest.raises(ValueError, match="does not follow"):
        expand([1, 7, 6], [], TOKENS)

"""Image preprocessing (metalqwen.vision_preprocess) equals mlx-vlm 0.7.10's Qwen3-VL processor:
the same rows bit for bit and the same patch grid, for images that are kept, resized, or pushed
up to min_pixels or down to max_pixels (the tiny folder's 64 x 64 and 128 x 128), in every input
form (array, PIL image, PNG/JPEG/GIF bytes, a path), with the folder's own settings."""

import io

import numpy as np
import pytest

from metalqwen.vision_preprocess import ProcessorConfig, preprocess, smart_resize

from .conftest import MAX_PIXELS, MIN_PIXELS, PREPROCESSOR, picture


@pytest.fixture(scope="module")
def reference(vlm):
    """mlx-vlm's image processor for the tiny folder, made as mlx-vlm makes it."""
    from mlx_vlm.models.qwen3_vl.processing_qwen3_vl import Qwen3VLImageProcessor, _qwen_vl_image_kwargs

    return Qwen3VLImageProcessor(**_qwen_vl_image_kwargs(vlm(), default_patch_size=16))


@pytest.fixture(scope="module")
def config(vlm):
    return ProcessorConfig.from_folder(vlm())


def test_settings_come_from_the_folder(config):
    # mlx_vlm.convert wrote processor_config.json (min/max_pixels) beside our preprocessor_config.json.
    assert (config.min_pixels, config.max_pixels) == (MIN_PIXELS, MAX_PIXELS)
    assert config.image_mean == tuple(PREPROCESSOR["image_mean"]) and config.image_std == tuple(PREPROCESSOR["image_std"])
    assert (config.patch_size, config.temporal_patch_size, config.merge_size) == (16, 2, 2)


def test_smart_resize_matches_over_a_grid_of_sizes():
    from mlx_vlm.models.qwen3_vl.processing_qwen3_vl import _smart_resize_image

    for h in range(8, 400, 13):
        for w in (16, 48, 80, 111, 250, 399):  # 48, 80: exact halves (round half to even)
            assert smart_resize(h, w, 32, MIN_PIXELS, MAX_PIXELS) == _smart_resize_image(h, w, 32, MIN_PIXELS,
                                                                                         MAX_PIXELS), (h, w)


@pytest.mark.parametrize("h,w", [(64, 64), (64, 96), (96, 64), (50, 70), (20, 30), (300, 200), (40, 1000)])
def test_rows_equal_mlx_vlm(reference, config, h, w):
    from PIL import Image

    img = picture(h, w, seed=h * w)
    got, grid = preprocess(img, config)
    want = reference([Image.fromarray(img)])  # (mlx-vlm takes a 3-D array as [C, H, W])
    assert list(grid) == want["image_grid_thw"][0].tolist()
    assert got.dtype == np.float32 and got.shape == want["pixel_values"].shape
    assert np.array_equal(got, want["pixel_values"])
    t, gh, gw = grid
    if max(h, w) < 20 * min(h, w):  # a side floored to one 32-pixel step may leave the area above max_pixels
        assert MIN_PIXELS <= gh * gw * 256 <= MAX_PIXELS


def test_every_input_form(reference, config, tmp_path):
    from PIL import Image

    rgba = picture(70, 90, seed=3)
    rgba = np.concatenate([rgba, np.full((70, 90, 1), 200, np.uint8)], -1)
    want = reference([Image.fromarray(rgba)])["pixel_values"]  # mlx-vlm converts a PIL image to RGB
    png = io.BytesIO()
    Image.fromarray(rgba).save(png, format="PNG")
    path = tmp_path / "picture.png"
    path.write_bytes(png.getvalue())
    for form in (rgba, Image.fromarray(rgba), png.getvalue(), str(path), path):
        assert np.array_equal(preprocess(form, config)[0], want), type(form)
    gray = picture(64, 64)[:, :, 0]
    assert np.array_equal(preprocess(gray, config)[0], reference([Image.fromarray(gray)])["pixel_values"])
    gif = io.BytesIO()
    frames = [Image.fromarray(picture(64, 80, seed=s)).convert("P") for s in (1, 2)]
    frames[0].save(gif, format="GIF", save_all=True, append_images=frames[1:])
    first = np.asarray(Image.open(io.BytesIO(gif.getvalue())).convert("RGB"))
    assert np.array_equal(preprocess(gif.getvalue(), config)[0], reference([Image.fromarray(first)])["pixel_values"])


def test_bad_inputs_are_refused(config):
    with pytest.raises(ValueError, match="uint8"):
        preprocess(np.zeros((8, 8, 3), np.float32), config)
    with pytest.raises(ValueError, match="aspect ratio"):
        preprocess(np.zeros((2, 500, 3), np.uint8), config)

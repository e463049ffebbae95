"""A tiny random Qwen3.5 checkpoint, written directly in the MLX format with numpy only.

``write_demo_checkpoint(folder)`` makes a folder that ``metalqwen.load`` and
``mlx_lm.load`` both accept, on machines without mlx: config.json with an MLX
``quantization`` block, model.safetensors (+ index) with affine-quantized linears and
embedding, a byte-level BPE tokenizer.json trained here with the ``tokenizers`` package,
and a ChatML-with-thinking chat template. The weights are random; the text is nonsense.

The primitives are public because the tests build Hugging Face-format checkpoints with
them too: ``bf16_bits``, ``quantize_affine`` / ``dequantize_affine`` (MLX's affine
scheme, bit-exact with ``mx.quantize``), ``write_safetensors``, ``random_weights``,
``build_tokenizer`` / ``write_tokenizer_files`` and ``CHAT_TEMPLATE``.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Iterable, Mapping

import numpy as np

__all__ = [
    "CHAT_TEMPLATE",
    "DEMO_DIMS",
    "bf16_bits",
    "bf16_to_f32",
    "build_tokenizer",
    "dequantize_affine",
    "quantize_affine",
    "random_weights",
    "write_demo_checkpoint",
    "write_safetensors",
    "write_tokenizer_files",
]

# ---------------------------------------------------------------------------- bf16


def bf16_bits(x) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), rounding to nearest, ties to even (NaN stays NaN)."""
    f = np.ascontiguousarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    out = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        out[nan] = ((u[nan] >> 16) | 0x0040).astype(np.uint16)
    return out


def bf16_to_f32(bits) -> np.ndarray:
    """bf16 bit patterns (uint16) -> float32 (exact)."""
    return (np.ascontiguousarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _round_bf16(x) -> np.ndarray:
    return bf16_to_f32(bf16_bits(x))


# ---------------------------------------------------------------------------- MLX affine quantization


def quantize_affine(w, bits: int, group_size: int):
    """MLX affine quantization of a float matrix [out, in] along ``in``.

    Returns ``(wq, scales, biases)``: wq uint32 [out, in*bits/32] with element j of a
    word in bits ``bits*j ..`` (element 0 lowest), scales and biases as bf16 bit
    patterns (uint16) [out, in/group_size], so that ``w ~ scale * q + bias``.

    Per group, in float32 as MLX computes it: the step is (max - min) / (2^bits - 1);
    the end of larger magnitude (the "edge") is made exactly representable by choosing
    the scale's sign and snapping it to edge / round(edge / step), and that edge becomes
    the bias. The scale is therefore negative when the edge is the maximum.
    """
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2 or w.shape[1] % group_size or (32 % bits):
        raise ValueError(f"quantize_affine: cannot quantize shape {w.shape} with bits {bits}, group {group_size}")
    rows, cols = w.shape
    g = w.reshape(rows, cols // group_size, group_size)
    levels = np.float32((1 << bits) - 1)
    hi, lo = g.max(axis=-1), g.min(axis=-1)
    edge_is_min = np.abs(lo) > np.abs(hi)
    step = np.maximum((hi - lo) / levels, np.float32(1e-7))
    scale = np.where(edge_is_min, step, -step).astype(np.float32)
    edge = np.where(edge_is_min, lo, hi).astype(np.float32)
    q_edge = np.rint(edge / scale)
    snapped = q_edge != 0
    scale = np.where(snapped, edge / np.where(snapped, q_edge, np.float32(1)), scale).astype(np.float32)
    bias = np.where(snapped, edge, np.float32(0)).astype(np.float32)
    q = np.clip(np.rint((g - bias[..., None]) / scale[..., None]), 0, levels).astype(np.uint32)
    per_word = 32 // bits
    q = q.reshape(rows, cols // per_word, per_word)
    shifts = np.arange(per_word, dtype=np.uint32) * np.uint32(bits)
    wq = np.bitwise_or.reduce(q << shifts, axis=-1).astype(np.uint32)
    return wq, bf16_bits(scale), bf16_bits(bias)


def dequantize_affine(wq, scales, biases, bits: int, group_size: int) -> np.ndarray:
    """Inverse of ``quantize_affine``: float32 [out, in] = scale * q + bias (scales/biases as bf16 bits)."""
    wq = np.asarray(wq, dtype=np.uint32)
    rows = wq.shape[0]
    per_word = 32 // bits
    shifts = np.arange(per_word, dtype=np.uint32) * np.uint32(bits)
    q = ((wq[..., None] >> shifts) & np.uint32((1 << bits) - 1)).reshape(rows, -1).astype(np.float32)
    cols = q.shape[1]
    s = bf16_to_f32(scales).reshape(rows, cols // group_size, 1)
    b = bf16_to_f32(biases).reshape(rows, cols // group_size, 1)
    return (q.reshape(rows, cols // group_size, group_size) * s + b).reshape(rows, cols)


# ---------------------------------------------------------------------------- safetensors

_NUMPY_TAG = {
    np.dtype(np.float32): "F32",
    np.dtype(np.float16): "F16",
    np.dtype(np.uint32): "U32",
    np.dtype(np.int32): "I32",
    np.dtype(np.uint8): "U8",
    np.dtype(np.int64): "I64",
}
_TAG_SIZE = {"F32": 4, "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "U8": 1, "I8": 1, "I64": 8, "U16": 2}


def write_safetensors(path: str | os.PathLike, tensors: Mapping[str, object], metadata: Mapping[str, str] | None = None,
                      *, pad_header: bool = True):
    """Writes a safetensors file. Values are numpy arrays or ``(dtype_tag, array)`` pairs.

    bf16 tensors are given as ``("BF16", uint16 bit patterns)``. Data is laid out widest
    dtype first (then by name) with no gaps, so every tensor is naturally aligned, and
    the header is padded with spaces to a multiple of 8 bytes, as the format allows.
    ``pad_header=False`` leaves the header unpadded, as MLX writes it: the data then starts
    at whatever byte the header ends on, and tensors are misaligned in the file.
    """
    entries = []
    for name, value in tensors.items():
        if isinstance(value, tuple):
            tag, arr = value
        else:
            arr = np.asarray(value)
            tag = _NUMPY_TAG.get(arr.dtype)
            if tag is None:
                raise ValueError(f"write_safetensors: {name}: no safetensors dtype for numpy {arr.dtype}")
        arr = np.ascontiguousarray(arr)
        if arr.dtype.itemsize != _TAG_SIZE[tag]:
            raise ValueError(f"write_safetensors: {name}: {tag} needs {_TAG_SIZE[tag]}-byte elements, got {arr.dtype}")
        entries.append((name, tag, arr))
    entries.sort(key=lambda e: (-_TAG_SIZE[e[1]], e[0]))
    header: dict = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, tag, arr in entries:
        header[name] = {"dtype": tag, "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    if pad_header:
        raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for _, _, arr in entries:
            f.write(arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes())


# ---------------------------------------------------------------------------- random weights

DEMO_DIMS = dict(
    hidden_size=512,
    num_hidden_layers=4,
    full_attention_interval=4,
    intermediate_size=1024,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=256,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    vocab_size=1024,
    rms_norm_eps=1e-6,
    rope_theta=10_000_000.0,
    partial_rotary_factor=0.25,
)


def _layer_types(dims: Mapping) -> list[str]:
    # Only the interval rule: mlx-lm ignores an explicit layer_types list, so a demo
    # folder must never depend on one.
    k = dims.get("full_attention_interval", 4)
    return ["full_attention" if (i + 1) % k == 0 else "linear_attention" for i in range(dims["num_hidden_layers"])]


def random_weights(dims: Mapping, seed: int = 0, mtp: bool = False) -> dict[str, np.ndarray]:
    """Float32 weights of a random Qwen3.5 text model, in the Hugging Face layout.

    Names are relative to the language model (``model.layers.0.mlp.gate_proj.weight``,
    ``lm_head.weight``, ``mtp.*``); the five zero-centred norms hold ``w`` (used as 1 + w),
    the DeltaNet conv1d is [C, 1, K], lm_head is always present (drop it when tied).
    Values are rounded to bf16 except A_log. Scales keep activations O(1) and logits spread
    over a few units, so argmax is well defined but not trivial.
    """
    rng = np.random.default_rng(seed)
    H, I, V = dims["hidden_size"], dims["intermediate_size"], dims["vocab_size"]
    nq, nkv, hd = dims["num_attention_heads"], dims["num_key_value_heads"], dims["head_dim"]
    nk, nv = dims["linear_num_key_heads"], dims["linear_num_value_heads"]
    dk, dv, K = dims["linear_key_head_dim"], dims["linear_value_head_dim"], dims["linear_conv_kernel_dim"]
    conv = 2 * nk * dk + nv * dv

    def lin(out, inp, gain=1.0):
        return _round_bf16(rng.standard_normal((out, inp), dtype=np.float32) * np.float32(gain / np.sqrt(inp)))

    def centred_norm(n):
        return _round_bf16(rng.standard_normal(n, dtype=np.float32) * np.float32(0.1))

    def attention(prefix, w):
        w[f"{prefix}.self_attn.q_proj.weight"] = lin(nq * hd * 2, H)
        w[f"{prefix}.self_attn.k_proj.weight"] = lin(nkv * hd, H)
        w[f"{prefix}.self_attn.v_proj.weight"] = lin(nkv * hd, H)
        w[f"{prefix}.self_attn.o_proj.weight"] = lin(H, nq * hd)
        w[f"{prefix}.self_attn.q_norm.weight"] = centred_norm(hd)
        w[f"{prefix}.self_attn.k_norm.weight"] = centred_norm(hd)

    def block_common(prefix, w):
        w[f"{prefix}.input_layernorm.weight"] = centred_norm(H)
        w[f"{prefix}.post_attention_layernorm.weight"] = centred_norm(H)
        w[f"{prefix}.mlp.gate_proj.weight"] = lin(I, H)
        w[f"{prefix}.mlp.up_proj.weight"] = lin(I, H)
        w[f"{prefix}.mlp.down_proj.weight"] = lin(H, I, gain=0.5)

    w: dict[str, np.ndarray] = {}
    w["model.embed_tokens.weight"] = _round_bf16(rng.standard_normal((V, H), dtype=np.float32) * np.float32(0.05))
    for i, kind in enumerate(_layer_types(dims)):
        p = f"model.layers.{i}"
        block_common(p, w)
        if kind == "full_attention":
            attention(p, w)
        else:
            a = f"{p}.linear_attn"
            w[f"{a}.in_proj_qkv.weight"] = lin(conv, H)
            w[f"{a}.in_proj_z.weight"] = lin(nv * dv, H)
            w[f"{a}.in_proj_b.weight"] = lin(nv, H)
            w[f"{a}.in_proj_a.weight"] = lin(nv, H, gain=0.5)
            w[f"{a}.out_proj.weight"] = lin(H, nv * dv)
            w[f"{a}.conv1d.weight"] = _round_bf16(rng.standard_normal((conv, 1, K), dtype=np.float32) * np.float32(0.5))
            # decay = exp(-A * softplus(a + dt_bias)) with A in [0.05, 1]: the state remembers.
            w[f"{a}.A_log"] = np.log(rng.uniform(0.05, 1.0, nv)).astype(np.float32)
            w[f"{a}.dt_bias"] = _round_bf16(rng.standard_normal(nv, dtype=np.float32) * np.float32(0.5))
            w[f"{a}.norm.weight"] = _round_bf16(1.0 + rng.standard_normal(dv, dtype=np.float32) * np.float32(0.1))
    w["model.norm.weight"] = centred_norm(H)
    w["lm_head.weight"] = _round_bf16(rng.standard_normal((V, H), dtype=np.float32) * np.float32(0.05))
    if mtp:
        w["mtp.fc.weight"] = lin(H, 2 * H)
        w["mtp.pre_fc_norm_embedding.weight"] = centred_norm(H)
        w["mtp.pre_fc_norm_hidden.weight"] = centred_norm(H)
        block_common("mtp.layers.0", w)
        attention("mtp.layers.0", w)
        w["mtp.norm.weight"] = centred_norm(H)
    return w


# ---------------------------------------------------------------------------- tokenizer

# Qwen3.5's pre-tokenizer split (letters with marks, single digits, punctuation runs, newlines).
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Added but not "special" (decoded even with skip_special_tokens), as in Qwen's tokenizer.
ADDED_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

_WORDS = (
    "the a of and to in is it that was for on are with as be this by at from or have an they which one you "
    "had not but what all were when we there can more if out so up said about other into than its time only "
    "model token layer cache state attention linear gated delta metal kernel buffer weight scale group bits "
    "quantize matrix vector stream decode prefill sample greedy logits prompt reply think answer question "
    "hello world python numpy apple silicon memory bandwidth fast small tiny random test check value error "
    "user assistant system tool call response function name arguments"
).split()
_TEXT = (
    "Qwen3.5 mixes Gated DeltaNet layers with gated attention. 12 + 30 = 42; 3.14159 is pi.\n"
    "def forward(x):\n    return x * 2  # double it\n"
    "你好，世界！我们今天测试一个小模型。日本語のテキストも少し入れます。\n"
    "Emoji: 😀 🚀 🎉 👍 — café, naïve, Zürich, façade.\n"
    "<think>\nLet me think about this step by step.\n</think>\n\nThe answer is 7.\n"
)


def _corpus(rng: np.random.Generator, lines: int = 3000) -> Iterable[str]:
    yield from _TEXT.splitlines(keepends=True) * 20
    for _ in range(lines):
        n = int(rng.integers(4, 14))
        words = [str(_WORDS[int(j)]) for j in rng.integers(0, len(_WORDS), n)]
        if rng.random() < 0.3:
            words[0] = words[0].capitalize()
        if rng.random() < 0.2:
            words.append(str(int(rng.integers(0, 10000))))
        yield " ".join(words) + (". " if rng.random() < 0.7 else "!\n")


def build_tokenizer(vocab_size: int = 1000, seed: int = 0):
    """A byte-level BPE ``tokenizers.Tokenizer`` shaped like Qwen's, trained on a small built-in corpus.

    ``vocab_size`` bounds the learned vocabulary (byte alphabet + merges); the special
    and added tokens come after it. Deterministic for a given (vocab_size, seed).
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(_corpus(np.random.default_rng(seed)), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    return tok


# A ChatML template with Qwen3-style thinking: past turns drop their reasoning, the last
# assistant turn keeps it, and the generation prompt opens a think block unless
# enable_thinking is false (then it writes an empty one).
CHAT_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages and messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
    {{- '# Tools\\n\\nYou have access to the following functions:\\n\\n<tools>' }}
    {%- for tool in tools %}{{- '\\n' + tool | tojson }}{%- endfor %}
    {{- '\\n</tools>\\n\\nTo call a function, reply with:\\n<tool_call>\\n<function=NAME>\\n<parameter=NAME>\\nVALUE\\n'
        + '</parameter>\\n</function>\\n</tool_call><|im_end|>\\n' }}
{%- elif messages and messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(last_user=-1) %}
{%- for message in messages %}
    {%- if message.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == 'system' %}
        {%- if not loop.first %}{{- raise_exception('The system message must come first.') }}{%- endif %}
    {%- elif message.role == 'user' %}
        {{- '<|im_start|>user\\n' + content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set reasoning = message.reasoning_content if message.reasoning_content is string else '' %}
        {%- if '</think>' in content %}
            {%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {{- '<|im_start|>assistant\\n' }}
        {%- if loop.index0 > ns.last_user %}
            {{- '<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' }}
        {%- endif %}
        {{- content }}
        {%- for call in message.tool_calls | default([]) %}
            {%- set fn = call.function if call.function is defined else call %}
            {{- '\\n<tool_call>\\n<function=' + fn.name + '>\\n' }}
            {%- for name, value in fn.arguments | dictsort %}
                {{- '<parameter=' + name + '>\\n' + (value if value is string else value | tojson) + '\\n</parameter>\\n' }}
            {%- endfor %}
            {{- '</function>\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {{- '<|im_start|>user\\n<tool_response>\\n' + content + '\\n</tool_response><|im_end|>\\n' }}
    {%- else %}
        {{- raise_exception('Unknown role: ' + message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- else %}
        {{- '<think>\\n' }}
    {%- endif %}
{%- endif %}
"""


def write_tokenizer_files(folder: str | os.PathLike, tokenizer=None, chat_template: str | None = CHAT_TEMPLATE,
                          template_file: bool = False) -> dict:
    """Writes tokenizer.json and tokenizer_config.json (and chat_template.jinja if ``template_file``).

    Returns ``{"eos": id of <|im_end|>, "endoftext": id of <|endoftext|>, "size": tokenizer size}``.
    """
    folder = os.fspath(folder)
    tokenizer = tokenizer or build_tokenizer()
    tokenizer.save(os.path.join(folder, "tokenizer.json"))
    decoder = {}
    for token in SPECIAL_TOKENS + ADDED_TOKENS:
        decoder[str(tokenizer.token_to_id(token))] = {
            "content": token, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": token in SPECIAL_TOKENS,
        }
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 262144,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    if chat_template is not None:
        if template_file:
            with open(os.path.join(folder, "chat_template.jinja"), "w", encoding="utf-8") as f:
                f.write(chat_template)
        else:
            config["chat_template"] = chat_template
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
    return {
        "eos": tokenizer.token_to_id("<|im_end|>"),
        "endoftext": tokenizer.token_to_id("<|endoftext|>"),
        "size": tokenizer.get_vocab_size(with_added_tokens=True),
    }


# ---------------------------------------------------------------------------- the MLX checkpoint

# Norms stored as (1 + w) in MLX checkpoints (mlx-lm's sanitize shifts exactly these).
_SHIFTED_NORMS = (".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight",
                  ".q_norm.weight", ".k_norm.weight")


def text_config(dims: Mapping, *, tied: bool, eos: int, layer_types: bool = True, rope_nested: bool = True,
                mtp_layers: int = 0) -> dict:
    """The text fields of a Qwen3.5 config.json (what goes under ``text_config``).
    ``layer_types`` adds the explicit list; ``rope_nested`` puts RoPE under rope_parameters."""
    tc = {
        "model_type": "qwen3_5_text",
        **{key: dims[key] for key in (
            "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
            "linear_value_head_dim", "linear_conv_kernel_dim", "vocab_size", "rms_norm_eps")},
        "max_position_embeddings": 262144,
        "full_attention_interval": dims.get("full_attention_interval", 4),
        "attention_bias": False,
        "attn_output_gate": True,
        "hidden_act": "silu",
        "tie_word_embeddings": tied,
        "eos_token_id": eos,
        "dtype": "bfloat16",
    }
    if mtp_layers:
        tc["mtp_num_hidden_layers"] = mtp_layers
    if layer_types:
        tc["layer_types"] = _layer_types(dims)
    rope = {"rope_theta": dims["rope_theta"], "partial_rotary_factor": dims["partial_rotary_factor"]}
    if rope_nested:
        tc["rope_parameters"] = {"rope_type": "default", **rope, "mrope_section": [11, 11, 10], "mrope_interleaved": True}
    else:
        tc.update(rope)
    return tc


def _start_folder(caller: str, folder, tokenizer_vocab: int, dims: Mapping) -> tuple[str, dict, dict]:
    """A demo folder's common start: the dimensions checked and completed, the folder made
    (it must be empty) and the tokenizer written. Returns (folder, dims, tokenizer facts)."""
    unknown = set(dims) - set(DEMO_DIMS)
    if unknown:
        raise TypeError(f"{caller}: unknown arguments {sorted(unknown)}")
    d = {**DEMO_DIMS, **dims}
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    if os.listdir(folder):
        raise FileExistsError(f"{caller}: {folder} is not empty")
    tok = write_tokenizer_files(folder, build_tokenizer(tokenizer_vocab, seed=0))
    if tok["size"] > d["vocab_size"]:
        raise ValueError(f"{caller}: vocab_size {d['vocab_size']} < tokenizer size {tok['size']}")
    return folder, d, tok


def hf_tensors(weights: Mapping[str, np.ndarray], *, tied: bool, a_log_bf16: bool = False) -> dict[str, object]:
    """``random_weights`` as a Hugging Face original stores them: the language model under
    ``model.language_model.*``, ``mtp.*`` and ``lm_head`` (dropped when tied) at the top, bf16
    but A_log (f32 as Qwen ships it, unless ``a_log_bf16``)."""
    tensors: dict[str, object] = {}
    for name, value in weights.items():
        if name == "lm_head.weight" and tied:
            continue
        key = "model.language_model." + name[len("model."):] if name.startswith("model.") else name
        f32 = name.endswith("A_log") and not a_log_bf16
        tensors[key] = value if f32 else ("BF16", bf16_bits(value))
    return tensors


def write_hf_demo_checkpoint(folder: str | os.PathLike, seed: int = 0, *, tie_word_embeddings: bool = False,
                             tokenizer_vocab: int = 1000, **dims) -> str:
    """Writes a tiny random Qwen3.5 original in the Hugging Face layout (as Qwen publishes it,
    with the multi-token-prediction head ``mtp.*``) to ``folder`` (created; must be empty), so
    ``metalqwen convert``, ``add-mtp`` and ``--speculative mtp`` can be tried without a download.
    Dimensions as ``write_demo_checkpoint``; returns the folder path."""
    folder, d, tok = _start_folder("write_hf_demo_checkpoint", folder, tokenizer_vocab, dims)
    tensors = hf_tensors(random_weights(d, seed, mtp=True), tied=tie_word_embeddings)
    write_safetensors(os.path.join(folder, "model.safetensors"), tensors, metadata={"format": "pt"})
    config = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "tie_word_embeddings": tie_word_embeddings,
        "text_config": text_config(d, tied=tie_word_embeddings, eos=tok["endoftext"], mtp_layers=1),
    }
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    _write_generation_config(folder, tok)
    return folder


def _write_generation_config(folder: str, tok: Mapping[str, int]) -> None:
    """Qwen's recommended sampling settings, as its folders carry them."""
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [tok["eos"], tok["endoftext"]], "do_sample": True,
                   "temperature": 0.6, "top_k": 20, "top_p": 0.95}, f, indent=2)


def write_demo_checkpoint(
    folder: str | os.PathLike,
    seed: int = 0,
    *,
    bits: int = 4,
    group_size: int = 64,
    tie_word_embeddings: bool = True,
    tokenizer_vocab: int = 1000,
    pad_header: bool = True,
    **dims,
) -> str:
    """Writes a tiny random Qwen3.5 checkpoint in the MLX format to ``folder`` (created; must be empty).

    Defaults (``DEMO_DIMS``): hidden 512, 4 layers (3 DeltaNet + 1 attention,
    full_attention_interval 4), head_dim 256, 2 q / 1 kv heads, DeltaNet 2 k / 4 v heads
    of 128, intermediate 1024, vocab 1024 (a ~1000-token byte-level BPE), tied
    embeddings, 4-bit affine quantization with group 64 (embedding included). Any
    ``DEMO_DIMS`` key can be overridden. ``pad_header=False`` writes the safetensors header
    unpadded as MLX does (see ``write_safetensors``): the same tensors, misaligned in the file.
    Returns the folder path.
    """
    folder, d, tok = _start_folder("write_demo_checkpoint", folder, tokenizer_vocab, dims)

    tensors: dict[str, object] = {}
    for name, value in random_weights(d, seed).items():
        if name == "lm_head.weight" and tie_word_embeddings:
            continue
        full = "language_model." + name
        if value.ndim == 2 and name.endswith(".weight"):  # every 2-D weight is a linear layer or the embedding
            module = full[: -len(".weight")]
            wq, scales, biases = quantize_affine(value, bits, group_size)
            tensors[module + ".weight"] = wq
            tensors[module + ".scales"] = ("BF16", scales)
            tensors[module + ".biases"] = ("BF16", biases)
        elif name.endswith("A_log"):
            tensors[full] = value.astype(np.float32)
        elif name.endswith("conv1d.weight"):
            tensors[full] = ("BF16", bf16_bits(np.moveaxis(value, 2, 1)))  # [C, 1, K] -> [C, K, 1]
        elif name.endswith(_SHIFTED_NORMS):
            tensors[full] = ("BF16", bf16_bits(np.float32(1.0) + value))
        else:
            tensors[full] = ("BF16", bf16_bits(value))

    write_safetensors(os.path.join(folder, "model.safetensors"), tensors, metadata={"format": "mlx"},
                      pad_header=pad_header)
    total = sum((v[1] if isinstance(v, tuple) else v).nbytes for v in tensors.values())
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total},
                   "weight_map": {k: "model.safetensors" for k in sorted(tensors)}}, f, indent=4)

    quant = {"group_size": group_size, "bits": bits, "mode": "affine"}
    config = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "tie_word_embeddings": tie_word_embeddings,
        "text_config": text_config(d, tied=tie_word_embeddings, eos=tok["endoftext"]),
        "quantization": quant,
        "quantization_config": dict(quant),
        "eos_token_id": tok["endoftext"],
    }
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=4)
    _write_generation_config(folder, tok)
    return folder

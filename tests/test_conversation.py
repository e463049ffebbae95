"""Multi-turn chat kept as tokens (metalqwen.conversation): each turn feeds only its own
tokens, and what it generates equals a cold run over the same tokens."""

from __future__ import annotations

import pytest

import metalqwen
from metalqwen.conversation import Conversation


@pytest.fixture(scope="module")
def chat_model(demo, device):
    return metalqwen.load(demo, device=device, max_context=512, progress=False)


def _turn(model, conversation, text, max_tokens=8):
    ids = conversation.prompt(text)
    cached = model._engine.tokens()
    out = model.generate(ids, max_tokens=max_tokens)
    conversation.record(ids, text, model.last_tokens, out.text)
    return ids, cached, out


def test_three_turns_feed_only_the_new_tokens_and_match_a_cold_run(chat_model, demo, device):
    m = chat_model
    m.reset()
    conversation = Conversation(m.tokenizer, m.eos_token_ids)
    # Re-rendering history would not reproduce the cache: the template drops the generated
    # `<think>` of earlier answers. (The control for the reuse asserted below.)
    first_ids, _, first = _turn(m, conversation, "hi")
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": first.text},
               {"role": "user", "content": "and then?"}]
    rendered = m.tokenizer.encode_chat(history)
    assert rendered[: len(conversation.ids)] != conversation.ids

    cold = metalqwen.load(demo, device=device, max_context=512, progress=False)
    for text in ("and then?", "a third message"):
        before = list(conversation.ids)
        ids, cached, out = _turn(m, conversation, text)
        assert ids[: len(before)] == before, "a turn must extend the conversation's tokens"
        assert cached == before[: len(cached)] and len(cached) >= len(before) - 1
        assert out.stats.prompt_tokens_reused == len(cached) > 0
        assert out.tokens == cold.generate(ids, max_tokens=8).tokens
        cold.reset()


def test_the_turn_text_follows_the_template(chat_model):
    m = chat_model
    conversation = Conversation(m.tokenizer, m.eos_token_ids, system="be brief")
    ids = conversation.prompt("hi")
    assert ids == m.tokenizer.encode_chat([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
    reply = m.tokenizer.encode("hello")
    eos = m.tokenizer.eos_token_id
    # After an eos the template's own end of the answer is not repeated...
    conversation.record(ids, "hi", reply + [eos], "hello")
    want = m.tokenizer.encode("\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n<think>\n")
    assert conversation.prompt("again") == ids + reply + [eos] + want
    # ... and an answer cut short (max_tokens, Ctrl-C) is closed by it.
    conversation.record(ids, "hi", reply, "hello")
    assert conversation.prompt("again") == ids + reply + [eos] + want


def test_restart_keeps_the_last_turns_that_fit(chat_model):
    m = chat_model
    conversation = Conversation(m.tokenizer, m.eos_token_ids)
    for i in range(3):
        ids = conversation.prompt(f"message {i} " + "word " * 10)
        conversation.record(ids, f"message {i} " + "word " * 10, m.tokenizer.encode(f"answer {i}"), f"answer {i}")
    whole = len(m.tokenizer.encode_chat(conversation._messages(conversation.turns, "new")))
    last_two = len(m.tokenizer.encode_chat(conversation._messages(conversation.turns[1:], "new")))
    ids = conversation.restart("new", limit=whole - 1)
    assert len(ids) == last_two and [t.user.split()[1] for t in conversation.turns] == ["1", "2"]
    assert conversation.ids == [] and conversation.prompt("new") == ids
    with pytest.raises(metalqwen.ContextFullError, match="message alone needs"):
        conversation.restart("new " * 50, limit=20)


@pytest.mark.parametrize("text", ["", "   ", None])
def test_an_empty_chat_message_is_refused(chat_model, text):
    conversation = Conversation(chat_model.tokenizer, chat_model.eos_token_ids)
    with pytest.raises(ValueError, match="needs some text"):
        conversation.prompt(text)

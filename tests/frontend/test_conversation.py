"""Multi-turn chat rendered by the template every turn (metalqwen.conversation): Qwen's
template drops the thinking of earlier answers, so a turn is not an extension of the tokens
fed before; the prefix cache resumes it at the end of the previous user turn, and what it
generates equals a cold run over the same prompt."""

from __future__ import annotations

import pytest

import metalqwen
from metalqwen.conversation import Conversation


@pytest.fixture(scope="module")
def chat_model(demo, device):
    return metalqwen.load(demo, device=device, max_context=512, prefix_cache_bytes=64 << 20, progress=False)


def _turn(model, conversation, text, max_tokens=8):
    prompt = conversation.prompt(text)
    out = model.generate(prompt.ids, boundaries=prompt.boundaries, max_tokens=max_tokens)
    conversation.record(prompt, text, out.text)
    return prompt, out


def test_a_thinking_chat_resumes_at_the_last_user_turn_and_matches_a_cold_run(chat_model, demo, device):
    m = chat_model
    m.reset()
    conversation = Conversation(m.tokenizer)
    first, out = _turn(m, conversation, "hi")
    assert first.opens_thinking and out.stats.prompt_tokens_reused == 0
    cold = metalqwen.load(demo, device=device, max_context=512, progress=False)
    fed = first.ids + m.last_tokens
    for text in ("and then?", "a third message"):
        prompt, out = _turn(m, conversation, text)
        # The template rewrote the last answer (its thinking dropped): the tokens fed are no prefix.
        assert prompt.ids[: len(fed)] != fed
        # The hit: the end of the previous user turn, a boundary the previous prompt was saved at.
        previous_user_end = max(first.boundaries)
        assert prompt.ids[:previous_user_end] == first.ids[:previous_user_end]
        assert out.stats.prompt_tokens_reused == previous_user_end > 0
        assert out.tokens == cold.generate(prompt.ids, max_tokens=8).tokens
        cold.reset()
        first, fed = prompt, prompt.ids + m.last_tokens


def test_the_history_is_rendered_without_old_thinking(chat_model):
    m = chat_model
    conversation = Conversation(m.tokenizer, system="be brief")
    prompt = conversation.prompt("hi")
    system = [{"role": "system", "content": "be brief"}]
    assert prompt.ids == m.tokenizer.encode_chat(system + [{"role": "user", "content": "hi"}])
    end_of = lambda messages: len(m.tokenizer.encode_chat(messages, add_generation_prompt=False))  # noqa: E731
    assert prompt.boundaries == [end_of(system), end_of(system + [{"role": "user", "content": "hi"}])]
    conversation.record(prompt, "hi", "a secret plan\n</think>\n\nhello")
    again = conversation.prompt("again")
    history = system + [{"role": "user", "content": "hi"},
                        {"role": "assistant", "content": "hello", "reasoning_content": "a secret plan"},
                        {"role": "user", "content": "again"}]
    assert again.ids == m.tokenizer.encode_chat(history)
    assert "secret" not in m.tokenizer.decode(again.ids) and "hello" in m.tokenizer.decode(again.ids)
    # An answer cut short inside its thinking is all reasoning: none of it is rendered back.
    conversation.record(again, "again", "half a thou")
    assert conversation.turns[-1].content == "" and "half a thou" not in m.tokenizer.decode(
        conversation.prompt("more").ids)


def test_restart_keeps_the_last_turns_that_fit(chat_model):
    m = chat_model
    conversation = Conversation(m.tokenizer)
    for i in range(3):
        prompt = conversation.prompt(f"message {i} " + "word " * 10)
        conversation.record(prompt, f"message {i} " + "word " * 10, f"thought {i}</think>\n\nanswer {i}")
    whole = len(conversation.prompt("new").ids)
    last_two = len(m.tokenizer.encode_chat(conversation._messages(conversation.turns[1:], "new")))
    prompt = conversation.restart("new", limit=whole - 1)
    assert len(prompt.ids) == last_two and [t.user.split()[1] for t in conversation.turns] == ["1", "2"]
    assert conversation.prompt("new") == prompt
    with pytest.raises(metalqwen.ContextFullError, match="message alone needs"):
        conversation.restart("new " * 50, limit=20)


@pytest.mark.parametrize("text", ["", "   ", None])
def test_an_empty_chat_message_is_refused(chat_model, text):
    conversation = Conversation(chat_model.tokenizer)
    with pytest.raises(ValueError, match="needs some text"):
        conversation.prompt(text)


def test_thinking_can_be_turned_off_in_a_conversation_and_a_chat_prompt(chat_model):
    m = chat_model
    thinking = Conversation(m.tokenizer).prompt("hi")
    direct = Conversation(m.tokenizer, enable_thinking=False).prompt("hi")
    as_variable = Conversation(m.tokenizer, template_kwargs={"enable_thinking": False}).prompt("hi")
    assert thinking.opens_thinking and not direct.opens_thinking and direct.ids == as_variable.ids
    # Qwen3.5's template closes an empty thinking block in the generation prompt.
    assert m.tokenizer.decode(direct.ids[len(thinking.ids) - 2:]).replace("\n", "") == "<think></think>"
    assert m.prompt_ids("hi", chat=True, enable_thinking=False) == direct.ids
    assert m.prompt_ids("hi", chat=True) == thinking.ids
    m.reset()
    assert m.generate("hi", chat=True, enable_thinking=False, max_tokens=2).stats.prompt_tokens == len(direct.ids)
    with pytest.raises(TypeError, match="enable_thinking must be True, False or None"):
        m.generate("hi", chat=True, enable_thinking="no")

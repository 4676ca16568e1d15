"""DPO preference pairs from bulk-job results.

The paper's rule (section "Preference data"): for each prompt, ``chosen`` is the response with the
highest reward and ``rejected`` the one with the lowest among the samples BEACON drew; a prompt
whose rewards are all equal carries no preference and is skipped. Records use the
``prompt``/``chosen``/``rejected`` columns that TRL's ``DPOTrainer`` reads (a chat prompt, a list
of messages, gets ``chosen`` and ``rejected`` as one assistant message each: TRL's conversational
format), plus ``margin`` = reward(chosen) - reward(rejected) in raw reward units (useful to
filter weak pairs), and the job key and prompt id so every pair traces back to its prompt.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from beacon.jobs.output import KeyedJsonlWriter

__all__ = ["DpoWriter", "dpo_record"]


def dpo_record(
    key: str,
    prompt_id: str | int,
    prompt: Any,
    pair: tuple[Any, Any] | None,
) -> dict[str, Any] | None:
    """A DPO line from a ``preference_pair()`` result, or None when there is no preference.

    ``pair`` is ``(chosen, rejected)`` where each side has ``text`` and ``reward`` (attributes or
    mapping keys). Returns None when ``pair`` is None or the rewards are equal.
    """
    if pair is None:
        return None
    chosen, rejected = pair
    c_text, c_reward = _text_reward(chosen)
    r_text, r_reward = _text_reward(rejected)
    if not c_reward > r_reward:
        return None
    if _is_chat(prompt):
        # TRL's conversational format: a prompt of messages takes chosen / rejected as
        # messages too (it concatenates prompt + chosen); a plain string there failed
        c_text, r_text = _assistant(c_text), _assistant(r_text)
    return {
        "key": key,
        "id": prompt_id,
        "prompt": prompt,
        "chosen": c_text,
        "rejected": r_text,
        "chosen_reward": c_reward,
        "rejected_reward": r_reward,
        "margin": c_reward - r_reward,
    }


def _is_chat(prompt: Any) -> bool:
    """A prompt given as a list of chat messages (JSON objects), as a prompt record allows."""
    return isinstance(prompt, list) and bool(prompt) and all(isinstance(m, Mapping)
                                                              for m in prompt)


def _assistant(text: Any) -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": text}]


def _text_reward(side: Any) -> tuple[Any, float]:
    if isinstance(side, Mapping):
        text, reward = side.get("text"), side.get("reward")
    else:
        text, reward = getattr(side, "text", None), getattr(side, "reward", None)
    if reward is None:
        raise ValueError(f"preference side without a reward: {side!r}")
    return text, float(reward)


class DpoWriter(KeyedJsonlWriter):
    """:class:`KeyedJsonlWriter` for DPO records (one pair per job key at most); a file whose
    records have no ``chosen`` (a job's output given as the DPO file) is refused on open.

    A chat prompt's ``chosen`` / ``rejected`` are written as the file already has them: one
    assistant message each (TRL's conversational format, for a new file) or, in a file begun
    by an older version, plain strings, so one file never mixes the two (a dataset loader
    needs one type per column)."""

    def __init__(self, path: str | Path, *, fsync: bool = True) -> None:
        self._chat_as_messages: bool | None = None  # None: no chat pair in the file yet
        super().__init__(path, key_field="key", fsync=fsync, required="chosen")

    def _seen(self, record: dict[str, Any]) -> None:
        if self._chat_as_messages is None and _is_chat(record.get("prompt")):
            self._chat_as_messages = isinstance(record.get("chosen"), list)

    def write(self, record: Mapping[str, Any]) -> bool:
        if _is_chat(record.get("prompt")):
            as_messages = self._chat_as_messages is not False
            record = {**record, **{side: _chat_side(record.get(side), as_messages)
                                   for side in ("chosen", "rejected") if side in record}}
            self._chat_as_messages = as_messages
        return super().write(record)

    def write_pair(self, record: Mapping[str, Any] | None) -> bool:
        """Write a :func:`dpo_record` result; None (no preference) writes nothing."""
        return False if record is None else self.write(record)


def _chat_side(side: Any, as_messages: bool) -> Any:
    """A chat pair's side as one assistant message, or as its text."""
    if as_messages:
        return _assistant(side) if isinstance(side, str) else side
    if isinstance(side, list) and len(side) == 1 and isinstance(side[0], Mapping) \
            and side[0].get("role") == "assistant":
        return side[0].get("content")
    return side

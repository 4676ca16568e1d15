"""BEACON inside a LangChain chain: ``prompt | BeaconRunnable(...)``, fully offline.

The "model" replays logged samples: for the Tree-of-Thoughts creative-writing task, GPT-4 wrote 10
passages per prompt and a GPT-4 judge scored each for coherency on 1-10
(``examples/data/tot_creative_writing_gpt4.jsonl``, MIT). The log keeps the scores, not the
passages, so a fake chat model answers with a placeholder per logged passage
(``[prompt 0 / passage 1]``), in logged order, and the scorer returns that passage's logged judge
score. The run shows exactly what BEACON would have done on the real model: how many of the 10
samples it drew, which one it chose, and why it stopped (the h-index against c / sigma at every
decision).

Run:  python examples/langchain_chain.py
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.prompts import ChatPromptTemplate
from pydantic import PrivateAttr

import beacon
from beacon_integrations.langchain import BeaconRunnable

DATA = Path(__file__).parent / "data" / "tot_creative_writing_gpt4.jsonl"
N_PROMPTS = 4


class LoggedSamplesChatModel(BaseChatModel):
    """Replays the logged samples of whichever prompt it is asked, in logged order."""

    samples: dict[str, list[str]]
    _next: dict[str, int] = PrivateAttr(default_factory=dict)

    @property
    def _llm_type(self) -> str:
        return "logged-samples"

    def _answer(self, messages: list[BaseMessage]) -> ChatResult:
        key = next(k for k in self.samples if k in messages[-1].text)
        i = self._next.get(key, 0)
        self._next[key] = i + 1
        text = self.samples[key][i]
        usage = {"input_tokens": 120, "output_tokens": 250, "total_tokens": 370}
        return ChatResult(generations=[ChatGeneration(
            message=AIMessage(content=text, usage_metadata=usage)  # type: ignore[arg-type]
        )])

    def _generate(self, messages: list[BaseMessage], stop: Any = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        return self._answer(messages)

    async def _agenerate(self, messages: list[BaseMessage], stop: Any = None,
                         run_manager: Any = None, **kwargs: Any) -> ChatResult:
        await asyncio.sleep(0.001)  # stands in for network latency
        return self._answer(messages)


def load() -> list[dict[str, Any]]:
    with DATA.open() as f:
        return [json.loads(line) for line in f][:N_PROMPTS]


async def main() -> None:
    rows = load()
    samples: dict[str, list[str]] = {}
    judge: dict[str, float] = {}
    for row in rows:
        texts = [f"[prompt {row['id']} / passage {i}]" for i in range(len(row["rewards"]))]
        samples[row["prompt"]] = texts
        judge.update(zip(texts, row["rewards"], strict=True))

    def coherency(prompt: str, response: str) -> float:
        """The logged GPT-4 coherency score (1-10) of this passage."""
        return judge[response]

    # c = 0.1 coherency points per sample: a sample must be expected to raise the best score by
    # more than 0.1 to be worth drawing (paper eq. "optimal stopping rule").
    cfg = beacon.BeaconConfig(cost=0.1, horizon=10, family="normal")
    prompt = ChatPromptTemplate.from_messages([
        ("system", "Write a coherent 4-paragraph passage."),
        ("human", "Each paragraph must end with these sentences, in order: {sentences}"),
    ])

    def make_chain() -> Any:
        best_of_n = BeaconRunnable(
            model=LoggedSamplesChatModel(samples=samples), scorer=coherency, config=cfg,
            return_result=True,
        )
        return prompt | best_of_n

    chain = make_chain()

    used_total = 0
    for row in rows:
        res = await chain.ainvoke({"sentences": row["prompt"]})
        best = res.best
        oracle = max(row["rewards"])
        used_total += res.n_samples
        print(f"prompt {row['id']}: chose {best.text!r} (reward {best.reward:.1f}); "
              f"used {res.n_samples}/{cfg.horizon} samples; stop reason: {res.stop_reason}")
        print(f"  rewards seen: {[c.reward for c in res.candidates]}  (best of all 10 = {oracle})")
        for t in res.trace:
            if t.decision == "draw" and t.k < cfg.k0:
                print(f"  k={t.k}: draw {t.count} (the prior needs k0={cfg.k0} rewards first)")
            elif t.reason == "horizon":
                print(f"  k={t.k}: stop (horizon: all n={cfg.horizon} samples drawn)")
            else:
                why = "h > c/sigma, continue" if t.decision == "draw" else f"stop ({t.reason})"
                print(f"  k={t.k}: zhat={t.zhat:.3f} h={t.h:.4f} threshold c/sigma="
                      f"{t.threshold:.4f} -> {why}")
        summary = {"id": row["id"], "n_samples": res.n_samples, "stop_reason": res.stop_reason,
                   "chosen_reward": best.reward,
                   "max_used_reward": max(c.reward for c in res.scored),
                   "horizon": cfg.horizon, "tokens": res.usage.total_tokens,
                   "data": DATA.name, "config": cfg.to_dict()}
        print("SUMMARY " + json.dumps(summary))

    # Streaming: BeaconRunnable.astream yields one chunk per scored candidate, then the final
    # choice. (Streamed as a chain step, it hands the next step its invoke output once; the
    # candidates are then the beacon_sample custom events of astream_events.)
    print("streaming the first prompt:")
    best_of_n = make_chain().last
    async for chunk in best_of_n.astream(await prompt.ainvoke({"sentences": rows[0]["prompt"]})):
        if chunk.kind == "candidate":
            print(f"  candidate k={chunk.k}: reward {chunk.reward}")
        else:
            print(f"  final: {chunk.text!r} after {chunk.n_samples} samples ({chunk.stop_reason})")
    print(f"total samples: {used_total} of {cfg.horizon * len(rows)} for best-of-10")


if __name__ == "__main__":
    asyncio.run(main())
